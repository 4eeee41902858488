import Foundation
import KraklRoom
import KraklScan
import Testing

/// Join codes read from pictures (issue 12 items 2, 3, 5): codes made by the
/// independent generator (Tests/Fixtures/make_join_code.py), drawn as QR by
/// Debian's qrencode and by python3-qrcode, converted by ffmpeg, read back
/// through stb_image and zbar; then the payloads and files that must be refused.
@Suite(.tags(.integration)) struct QRScanTests {
    static let python = "/usr/bin/python3"
    static let generator = Harness.repoRoot + "/Tests/Fixtures/make_join_code.py"
    static let pictures = Harness.repoRoot + "/Tests/Fixtures/qr_pictures.py"

    /// The tools these tests draw with, or nil after printing SKIP.
    static func tools(python qrcode: Bool = false, ffmpeg: Bool = false) throws -> Bool {
        guard Harness.which("qrencode") != nil else { skipTest("qrencode is not installed (Debian qrencode)"); return false }
        if qrcode, try Harness.run(python, ["-c", "import qrcode, PIL"]).status != 0 {
            skipTest("python3-qrcode or python3-pil is not installed"); return false
        }
        if ffmpeg, Harness.which("ffmpeg") == nil { skipTest("ffmpeg is not installed"); return false }
        return true
    }

    /// A fresh code from the Python generator; `ttl` < 0 gives an expired one.
    static func makeCode(identity: String = "Ada", room: String = "1234", ttl: Int = 3600) throws -> String {
        let now = Int(Date().timeIntervalSince1970)
        let result = try Harness.run(python, [generator, "--kind", "janus", "--url", "http://127.0.0.1:8088/janus", "--room", room,
                                              "--identity", identity, "--iat", "\(now - 7200)", "--exp", "\(now + ttl)"])
        try #require(result.status == 0, "make_join_code.py: \(result.stderr)")
        return result.stdout.trimmingCharacters(in: .newlines)
    }

    /// Draws `payload` with qrencode (4 px a module, 4-module margin) and returns the PNG's path.
    static func qrencode(_ payload: [UInt8], level: String = "M", in folder: String, name: String = UUID().uuidString) throws -> String {
        let input = folder + "/\(name).txt", output = folder + "/\(name).png"
        try Data(payload).write(to: URL(fileURLWithPath: input))
        let result = try Harness.run(Harness.which("qrencode")!, ["-l", level, "-s", "4", "-m", "4", "-r", input, "-o", output])
        try #require(result.status == 0, "qrencode: \(result.stderr)")
        return output
    }

    static func qrencode(_ text: String, level: String = "M", in folder: String, name: String = UUID().uuidString) throws -> String {
        try qrencode(Array(text.utf8), level: level, in: folder, name: name)
    }

    /// The same with python3-qrcode.
    static func pythonQR(_ text: String, level: String, in folder: String) throws -> String {
        let name = UUID().uuidString
        let input = folder + "/\(name).txt", output = folder + "/\(name).png"
        try text.write(toFile: input, atomically: true, encoding: .utf8)
        let result = try Harness.run(python, [pictures, "encode", input, output, level])
        try #require(result.status == 0, "qr_pictures.py encode: \(result.stderr)")
        return output
    }

    /// ffmpeg converts a picture (to .jpg, .ppm as rgb24, .pgm as gray).
    static func convert(_ path: String, to suffix: String) throws -> String {
        let output = (path as NSString).deletingPathExtension + "." + suffix
        var arguments = ["-y", "-loglevel", "error", "-i", path]
        switch suffix {
        case "jpg": arguments += ["-q:v", "4"]
        case "ppm": arguments += ["-pix_fmt", "rgb24"]
        case "pgm": arguments += ["-pix_fmt", "gray"]
        default: break
        }
        let result = try Harness.run(Harness.which("ffmpeg")!, arguments + [output])
        try #require(result.status == 0, "ffmpeg: \(result.stderr)")
        return output
    }

    static func payloads(_ path: String) throws -> [[UInt8]] {
        QRScanner().scan(try ImageFile.readGray(path: path))
    }

    static func readError(_ path: String, limits: ImageLimits = ImageLimits()) -> ImageFileError? {
        do throws(ImageFileError) {
            _ = try ImageFile.readGray(path: path, limits: limits)
            return nil
        } catch {
            return error
        }
    }

    // MARK: - Real codes decode exactly

    @Test func qrencodeCodesDecodeAtEveryLevelAsPNGJPEGAndPNM() throws {
        guard try Self.tools(ffmpeg: true) else { return }
        let folder = try Harness.temporaryDirectory()
        let code = try Self.makeCode()
        for level in ["L", "M", "Q", "H"] {
            let png = try Self.qrencode(code, level: level, in: folder, name: "code-\(level)")
            var files = [png, try Self.convert(png, to: "jpg")]
            if level == "M" { files += [try Self.convert(png, to: "ppm"), try Self.convert(png, to: "pgm")] }
            for file in files {
                let found = try Self.payloads(file)
                #expect(found == [Array(code.utf8)], "\(level) \(file): \(found.map { String(decoding: $0, as: UTF8.self) })")
                guard case .found(let invitation) = ScanResult.classify(found, now: Date()) else {
                    Issue.record("\(file): not found as a join code"); continue
                }
                #expect(invitation.code.text == code && invitation.room == "1234" && invitation.identity == "Ada")
            }
        }
    }

    @Test func pythonQRCodesDecodeAtEveryLevelAsPNGAndJPEG() throws {
        guard try Self.tools(python: true, ffmpeg: true) else { return }
        let folder = try Harness.temporaryDirectory()
        let code = try Self.makeCode(identity: "Grace's laptop", room: "room-7")
        for level in ["L", "M", "Q", "H"] {
            let png = try Self.pythonQR(code, level: level, in: folder)
            for file in [png, try Self.convert(png, to: "jpg")] {
                #expect(try Self.payloads(file) == [Array(code.utf8)], "\(level) \(file)")
            }
        }
    }

    // MARK: - Damage

    /// Modules across a qrencode picture (4 px a module, 4-module margin).
    static func modules(_ png: String) throws -> Int { try ImageFile.readGray(path: png).width / 4 - 8 }

    static func blank(_ png: String, x: Int, y: Int, width: Int, height: Int) throws -> String {
        let output = png + ".damaged.png"
        let result = try Harness.run(python, [pictures, "blank", png, output, "4", "4", "\(x)", "\(y)", "\(width)", "\(height)"])
        try #require(result.status == 0, "qr_pictures.py blank: \(result.stderr)")
        return output
    }

    @Test func damageWithinTheErrorCorrectionBudgetDecodes() throws {
        guard try Self.tools(python: true) else { return }
        let folder = try Harness.temporaryDirectory()
        let code = try Self.makeCode()
        let png = try Self.qrencode(code, level: "H", in: folder)
        let size = try Self.modules(png)
        // 6×6 modules out of the middle: a few codewords, well inside level H's ~30 %.
        let damaged = try Self.blank(png, x: size / 2 - 3, y: size / 2 - 3, width: 6, height: 6)
        #expect(try Self.payloads(damaged) == [Array(code.utf8)])
    }

    @Test func damageBeyondTheBudgetReportsNothingFalse() throws {
        guard try Self.tools(python: true) else { return }
        let folder = try Harness.temporaryDirectory()
        let code = try Self.makeCode()
        let png = try Self.qrencode(code, level: "L", in: folder)
        let size = try Self.modules(png)
        // A band a third of the code wide, between the finder patterns: far beyond level L's ~7 %.
        let damaged = try Self.blank(png, x: size / 3, y: 9, width: size / 3, height: size - 18)
        let found = try Self.payloads(damaged)
        #expect(found.allSatisfy { $0 == Array(code.utf8) }, "a false payload: \(found.map { String(decoding: $0.prefix(40), as: UTF8.self) })")
        #expect(found.isEmpty, "decoded beyond the budget (true but unexpected)")
    }

    // MARK: - What is found

    @Test func aForeignQRIsNotAJoinCodeAndShownShortened() throws {
        guard try Self.tools() else { return }
        let url = "https://example.org/conference/join?session=42&lang=en"
        let found = try Self.payloads(try Self.qrencode(url, in: try Harness.temporaryDirectory()))
        let result = ScanResult.classify(found, now: Date())
        #expect(result == .noUsableCode([.notAJoinCode(preview: String(url.prefix(24)) + "…")]))
        #expect(result.description == "found a QR code that is not a krakl join code: https://example.org/conf…")
    }

    @Test func twoJoinCodesInOnePictureAreRefusedAndListed() throws {
        guard try Self.tools(python: true) else { return }
        let folder = try Harness.temporaryDirectory()
        let ada = try Self.makeCode(identity: "Ada", room: "1234"), bob = try Self.makeCode(identity: "Bob", room: "5678")
        let output = folder + "/two.png"
        let side = try Harness.run(Self.python, [Self.pictures, "side", try Self.qrencode(ada, in: folder), try Self.qrencode(bob, in: folder), output])
        try #require(side.status == 0, "\(side.stderr)")
        let found = try Self.payloads(output)
        #expect(Set(found) == Set([Array(ada.utf8), Array(bob.utf8)]))
        guard case .conflicting(let invitations) = ScanResult.classify(found, now: Date()) else {
            Issue.record("not refused as two codes"); return
        }
        #expect(Set(invitations.map(\.identity)) == ["Ada", "Bob"] && Set(invitations.compactMap(\.room)) == ["1234", "5678"])
        let message = ScanResult.conflicting(invitations).description
        #expect(message.contains("room \"1234\" as \"Ada\"") && message.contains("room \"5678\" as \"Bob\""), "\(message)")
        JoinCodeTests.checkMessage(message, token: invitations[0].code.token, multiline: true)
    }

    @Test func anOversizedPayloadIsRejected() throws {
        guard try Self.tools() else { return }
        // Digits make a numeric segment: these 4150 bytes fit a version-31 code (141 modules) at level L.
        let text = "krakl:v=1;k=janus;u=http://127.0.0.1:8088/janus;r=" + String(repeating: "7", count: 4100)
        let found = try Self.payloads(try Self.qrencode(text, level: "L", in: try Harness.temporaryDirectory()))
        #expect(found == [Array(text.utf8)])
        #expect(ScanResult.classify(found, now: Date()) == .noUsableCode([.rejected(.tooLong(bytes: text.utf8.count))]))
    }

    @Test func aNonASCIIPayloadIsRejectedAsBytesNotGuessedText() throws {
        guard try Self.tools() else { return }
        let folder = try Harness.temporaryDirectory()
        // UTF-8 "é", and a lone Latin-1 0xE9 that a charset-guessing reader would turn into "é" too.
        for (payload, position) in [(Array("krakl:v=1;k=janus;r=caf\u{E9}".utf8), 24), (Array("krakl:v=1;r=caf".utf8) + [0xE9], 16)] {
            let found = try Self.payloads(try Self.qrencode(payload, level: "M", in: folder))
            #expect(found == [payload], "zbar converted the bytes: \(found)")
            #expect(ScanResult.classify(found, now: Date()) == .noUsableCode([.rejected(.notASCII(position: position))]))
        }
    }

    @Test func anExpiredCodeSaysSo() throws {
        guard try Self.tools() else { return }
        let code = try Self.makeCode(ttl: -3600)
        let found = try Self.payloads(try Self.qrencode(code, in: try Harness.temporaryDirectory()))
        guard case .noUsableCode(let findings) = ScanResult.classify(found, now: Date()), findings.count == 1,
              case .expired(let error) = findings[0], case .tokenExpired = error else {
            Issue.record("not reported as expired: \(ScanResult.classify(found, now: Date()))"); return
        }
        #expect(findings[0].description.hasPrefix("found a join code that has expired: the join code's token expired at"))
        JoinCodeTests.checkMessage(findings[0].description, token: try JoinCode(parsing: code).token)
    }

    // MARK: - Payload lists (no pictures)

    @Test func payloadListsAddUp() throws {
        let now = JoinCodeTests.now
        let token = JoinCodeTests.token()
        let code = JoinCodeTests.code("k=janus;u=http://127.0.0.1:8088/janus;r=7;t=TOKEN", token: token)
        let other = JoinCodeTests.code("k=janus;u=http://127.0.0.1:8088/janus;r=8;t=TOKEN", token: token)
        let bytes = Array(code.utf8)
        #expect(ScanResult.classify([], now: now) == .nothing)
        // The same code twice, and with a foreign QR beside it: found, once.
        guard case .found(let invitation) = ScanResult.classify([bytes, Array("https://x".utf8), bytes], now: now) else {
            Issue.record("not found"); return
        }
        #expect(invitation.room == "7")
        // A trailing newline is trimmed; a control character inside is not read.
        #expect(ScanResult.classify([bytes + [0x0A]], now: now) == .found(invitation))
        #expect(PayloadFinding.classify(Array("krakl:v=1;\u{1B}[2J".utf8), now: now) == .rejected(.controlCharacter(position: 11)))
        #expect(PayloadFinding.classify(Array("short".utf8), now: now) == .notAJoinCode(preview: "short"))
        if case .conflicting(let both) = ScanResult.classify([bytes, Array(other.utf8)], now: now) {
            #expect(both.map(\.room) == ["7", "8"])
        } else {
            Issue.record("two codes not refused")
        }
        // A broken code is a join code that cannot be used, not a foreign QR.
        guard case .unusableJoinCode(.malformedCode(.missingField("t"))) = PayloadFinding.classify(Array("krakl:v=1;k=janus;u=http://h/".utf8), now: now) else {
            Issue.record("missing t= not reported"); return
        }
    }

    // MARK: - Files that are not pictures to decode

    /// PNG signature, IHDR (width, height, 8-bit, `colour`), a stub IDAT, IEND, CRCs computed here.
    static func pngHeader(width: UInt32, height: UInt32, colour: UInt8) -> Data {
        func chunk(_ type: String, _ body: [UInt8]) -> [UInt8] {
            let typed = Array(type.utf8) + body
            return be32(UInt32(body.count)) + typed + be32(crc32(typed))
        }
        let ihdr = be32(width) + be32(height) + [8, colour, 0, 0, 0]
        return Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A] + chunk("IHDR", ihdr) + chunk("IDAT", [0x78, 0x9C, 0x03, 0x00]) + chunk("IEND", []))
    }

    static func be32(_ value: UInt32) -> [UInt8] { [24, 16, 8, 0].map { UInt8(truncatingIfNeeded: value >> $0) } }

    static func crc32(_ bytes: [UInt8]) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in bytes {
            crc ^= UInt32(byte)
            for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0xEDB8_8320 : crc >> 1 }
        }
        return ~crc
    }

    @Test func unreadableFilesGetTheirOwnErrors() throws {
        guard try Self.tools() else { return }
        let folder = try Harness.temporaryDirectory()
        let empty = folder + "/empty.png", garbage = folder + "/garbage.png", truncated = folder + "/truncated.png"
        let bomb = folder + "/bomb.png", rgbBomb = folder + "/rgb-bomb.png"
        try Data().write(to: URL(fileURLWithPath: empty))
        try Data("this is not a picture at all, just text\n".utf8).write(to: URL(fileURLWithPath: garbage))
        let whole = try Data(contentsOf: URL(fileURLWithPath: try Self.qrencode(try Self.makeCode(), in: folder)))
        try whole.prefix(whole.count / 2).write(to: URL(fileURLWithPath: truncated))
        try Self.pngHeader(width: 30000, height: 30000, colour: 0).write(to: URL(fileURLWithPath: bomb))
        try Self.pngHeader(width: 30000, height: 30000, colour: 2).write(to: URL(fileURLWithPath: rgbBomb))

        #expect(Self.readError(empty) == .empty(path: empty))
        #expect(Self.readError(garbage) == .unknownFormat(path: garbage))
        guard case .damaged(truncated, _)? = Self.readError(truncated) else {
            Issue.record("truncated PNG: \(String(describing: Self.readError(truncated)))"); return
        }
        // The gray header is within what stb decodes, so our limit speaks; the RGB one stb refuses itself (> 1 GiB).
        #expect(Self.readError(bomb) == .tooLarge(path: bomb, width: 30000, height: 30000, limits: ImageLimits()))
        #expect(Self.readError(rgbBomb) == .tooLarge(path: rgbBomb, width: nil, height: nil, limits: ImageLimits()))
        // A small limit refuses a real code's picture before decoding it.
        let small = ImageLimits(maximumSide: 100, maximumPixels: 10_000)
        let real = try Self.qrencode("https://example.org", in: folder)
        guard case .tooLarge(real, _?, _?, small)? = Self.readError(real, limits: small) else { Issue.record("limit not applied"); return }
        #expect(Self.readError(folder) == .notAFile(path: folder))
        #expect(Self.readError(folder + "/missing.png") == .cannotOpen(path: folder + "/missing.png", reason: "No such file or directory"))
        for error in [Self.readError(empty), Self.readError(truncated), Self.readError(bomb), Self.readError(rgbBomb)] {
            #expect(error.map { !$0.description.contains("\n") && $0.description.contains(folder) } == true)
        }
    }

    // MARK: - Through the agent

    @Test func theAgentReadsAQRFile() throws {
        guard try Self.tools(python: true) else { return }
        try Harness.requireBuild()
        let folder = try Harness.temporaryDirectory()
        let code = try Self.makeCode(identity: "Ada", room: "1234")
        let good = try Self.qrencode(code, level: "Q", in: folder)
        let probe = try Harness.agent(["--qr", good, "--scan-only"], timeout: 30)
        if probe.status == 2 && probe.stderr.contains("unknown flag --qr") {
            skipTest("krakl-agent has no --qr yet (ScanCommand.swift is not hooked into Arguments.swift/main.swift)")
            return
        }
        #expect(probe.status == 0, "\(probe.stderr)")
        #expect(probe.stdout.contains("room:     1234") && probe.stdout.contains("identity: Ada") && probe.stdout.contains("Janus VideoRoom"), "\(probe.stdout)")
        JoinCodeTests.checkMessage(probe.stdout, token: try JoinCode(parsing: code).token, multiline: true)

        let empty = folder + "/empty.png", bomb = folder + "/bomb.png", blank = folder + "/blank.pgm"
        try Data().write(to: URL(fileURLWithPath: empty))
        try Self.pngHeader(width: 30000, height: 30000, colour: 0).write(to: URL(fileURLWithPath: bomb))
        try (Data("P5\n64 64\n255\n".utf8) + Data(repeating: 255, count: 64 * 64)).write(to: URL(fileURLWithPath: blank))
        let two = folder + "/two.png"
        let side = try Harness.run(Self.python, [Self.pictures, "side", good, try Self.qrencode(try Self.makeCode(identity: "Bob", room: "9"), in: folder), two])
        try #require(side.status == 0, "\(side.stderr)")
        let cases: [(String, Int32, String)] = [
            (blank, 45, "no QR code found"), (empty, 46, "is empty"), (bomb, 47, "30000x30000"),
            (try Self.qrencode("https://example.org/a/long/path", in: folder), 48, "not a krakl join code: https://example.org/a/lo…"),
            (two, 49, "not guessing"), (try Self.qrencode(try Self.makeCode(ttl: -600), in: folder), 39, "expired"),
        ]
        for (file, status, text) in cases {
            let result = try Harness.agent(["--qr", file, "--scan-only"], timeout: 30)
            #expect(result.status == status && result.stderr.contains(text), "\(file): \(result.status) \(result.stderr)")
        }
    }
}
