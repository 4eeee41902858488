import Foundation
import KraklCore

/// The home screen's "scan the screen": `scanScreen` on a thread of its own (it waits for frames),
/// reporting to the home screen's loop through the two closures; `stop` ends it within a wait.
final class HomeScan: ScanHost, @unchecked Sendable {
    /// Why a scan gave no code: the words to show (nil: stopped by the person, nothing to say).
    struct Failure: Error { let words: String? }

    private let condition = NSCondition()
    private var stopped = false
    private var changed = false
    private let progressReport: (String) -> Void

    /// Starts scanning at once; `done` gets the join code's text or why there is none.
    init(arguments: Arguments, logger: @escaping BackendLogger, done: @escaping (Result<String, Failure>) -> Void,
         progress: @escaping (String) -> Void) throws(HostError) {
        progressReport = progress
        // Fails here, not on the thread, when the backend cannot be chosen.
        _ = try selectedBackend(arguments)
        var settings = arguments
        settings.scanOnly = false
        let scanning = settings
        let thread = Thread { [self] in
            do throws(HostError) {
                let (invitation, status) = try scanScreen(scanning, logger: logger, host: self)
                if let invitation { done(.success(invitation.code.text)) } else {
                    done(.failure(Failure(words: status == 0 ? "Scanning stopped." : "Scanning: \(lastSaid)")))
                }
            } catch {
                done(.failure(Failure(words: "Cannot scan the screen: \(error.description)")))
            }
        }
        thread.name = "krakl-home-scan"
        thread.start()
    }

    /// The last line `scanScreen` said (why it ended): the scan thread only.
    private var lastSaid = "scanning stopped"

    func stop() {
        condition.withLock {
            stopped = true
            condition.signal()
        }
    }

    func wait(_ seconds: Double) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        let deadline = Date().addingTimeInterval(seconds)
        while !stopped && !changed {
            if !condition.wait(until: deadline) { break }
        }
        changed = false
        return stopped
    }

    func wake() {
        condition.withLock {
            changed = true
            condition.signal()
        }
    }

    func say(_ line: String) {
        lastSaid = line
        progressReport("Scanning: " + line)
    }

    func progress(_ line: String) { progressReport(line.prefix(1).uppercased() + line.dropFirst()) }
}
