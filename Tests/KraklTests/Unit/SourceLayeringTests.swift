import Foundation
import Testing

/// The tree reads as the data flow only while its layers point one way: these read the sources
/// and Package.swift, so a back-edge fails here, named, instead of growing unseen.
@Suite(.tags(.unit)) struct SourceLayeringTests {
    /// KraklRTC's folders, lowest first (README, "Layout"): each may use those before it only.
    static let rtcLayers = ["Net", "Crypto", "ICE", "DTLS", "RTP", "SDP", "Peer"]

    /// The Swift files of a folder of KraklRTC, comments stripped (a comment may name any layer).
    static func code(of layer: String) throws -> [(file: String, text: String)] {
        let folder = Harness.repoRoot + "/Sources/KraklRTC/" + layer
        return try FileManager.default.contentsOfDirectory(atPath: folder).filter { $0.hasSuffix(".swift") }.sorted().map { name in
            let text = try String(contentsOfFile: folder + "/" + name, encoding: .utf8)
            let code = text.split(separator: "\n", omittingEmptySubsequences: false).map { line -> Substring in
                guard let slashes = line.range(of: "//") else { return line }
                return line[..<slashes.lowerBound]
            }.joined(separator: "\n")
            return (name, code)
        }
    }

    /// Names a declaration introduces (class, struct, enum, protocol, typealias, actor).
    static func declaredTypes(in text: String) -> Set<String> {
        var names = Set<String>()
        let words = text.split(whereSeparator: { !($0.isLetter || $0.isNumber || $0 == "_") })
        for (index, word) in words.enumerated().dropLast() where ["class", "struct", "enum", "protocol", "typealias", "actor"].contains(word) {
            let name = words[index + 1]
            if let first = name.first, first.isUppercase { names.insert(String(name)) }
        }
        return names
    }

    @Test func kraklRTCLayersUseOnlyTheLayersBelowThem() throws {
        let layers = try Self.rtcLayers.map { try Self.code(of: $0) }
        #expect(layers.allSatisfy { !$0.isEmpty }, "a layer folder is missing or empty: \(Self.rtcLayers)")
        let folders = try FileManager.default.contentsOfDirectory(atPath: Harness.repoRoot + "/Sources/KraklRTC")
            .filter { !$0.hasSuffix(".swift") }
        #expect(Set(folders) == Set(Self.rtcLayers), "KraklRTC's folders are not the layers this test orders: \(folders.sorted())")
        var home: [String: Int] = [:]
        for (level, files) in layers.enumerated() {
            for file in files { for name in Self.declaredTypes(in: file.text) where home[name] == nil { home[name] = level } }
        }
        #expect(home["Publisher"] == Self.rtcLayers.firstIndex(of: "Peer") && home["StunMessage"] == Self.rtcLayers.firstIndex(of: "ICE"),
                "the declarations were not found where they live")
        var upward: [String] = []
        for (level, files) in layers.enumerated() {
            for file in files {
                let words = Set(file.text.split(whereSeparator: { !($0.isLetter || $0.isNumber || $0 == "_") }).map(String.init))
                for word in words.sorted() {
                    if let above = home[word], above > level {
                        upward.append("\(Self.rtcLayers[level])/\(file.file) uses \(word) from \(Self.rtcLayers[above])/")
                    }
                }
            }
        }
        #expect(upward.isEmpty, "KraklRTC's layers point up: \(upward.joined(separator: "; "))")
    }

    /// The network stack and the room and viewer code never depend on the backend loader.
    @Test func theNetworkModulesDoNotDependOnTheBackendHost() throws {
        let manifest = try String(contentsOfFile: Harness.repoRoot + "/Package.swift", encoding: .utf8)
        for target in ["KraklBase", "KraklRTC", "KraklRoom", "KraklViewer"] {
            let line = try #require(manifest.split(separator: "\n").first { $0.contains(".target(name: \"\(target)\"") },
                                    "no .target(name: \"\(target)\") line in Package.swift")
            #expect(!line.contains("\"KraklHost\"") && !line.contains("\"KraklEncoder\"") && !line.contains("\"KraklSession\""),
                    "\(target) depends on a module above it: \(line)")
        }
    }
}
