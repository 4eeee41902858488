import Foundation
import KraklRoom
import KraklScan

// `krakl-agent --qr FILE [--scan-only]`: the join code from a picture.
// Exit statuses 45–49 (docs/exit-codes.md); an expired or unusable code
// exits like the same code given to --join (39–43).

extension ImageFileError {
    var exitStatus: Int32 {
        switch self {
        case .tooLarge: return 47
        case .cannotOpen, .notAFile, .empty, .unknownFormat, .damaged: return 46
        }
    }
}

/// Reads the QR codes in the picture at `path` and judges them. Returns the
/// join code's text when there is one to join with (never with
/// `scanOnly`, which prints its summary instead), and the exit status for
/// when there is not (0 after a summary).
func runQRFile(path: String, scanOnly: Bool, now: Date = Date()) -> (code: String?, status: Int32) {
    func fail(_ message: String, _ status: Int32) -> (code: String?, status: Int32) {
        fputs("krakl-agent: \(message)\n", stderr)
        return (nil, status)
    }
    let image: GrayImage
    do throws(ImageFileError) {
        image = try ImageFile.readGray(path: path)
    } catch {
        return fail(error.description, error.exitStatus)
    }
    let result = ScanResult.classify(QRScanner().scan(image), now: now)
    switch result {
    case .nothing:
        return fail("no QR code found in \(path) (\(image.width)x\(image.height) pixels)", 45)
    case .found(let invitation):
        if scanOnly {
            print(invitation.summary(now: now))
            return (nil, 0)
        }
        print("krakl-agent: \(path): \(result)")
        return (invitation.code.text, 0)
    case .conflicting:
        return fail("\(path): \(result)", 49)
    case .noUsableCode(let findings):
        // The most useful status: a code that was meant for us beats a foreign QR.
        var status: Int32 = 48
        for finding in findings {
            fputs("krakl-agent: \(path): \(finding)\n", stderr)
            switch finding {
            case .expired(let error): status = error.exitStatus
            case .unusableJoinCode(let error) where status == 48: status = error.exitStatus
            default: break
            }
        }
        return (nil, status)
    }
}
