import KraklBase
import KraklHost
import KraklRTC
import KraklSession

// The agent's side of SessionController (Sources/KraklSession): what each session is made of comes
// from the command line, each end's exit status from ExitStatus.swift, notifications go to the
// desktop, and a connect may name a QR picture instead of the join code's text.

extension DesktopNotifier: SessionNotifier {}

extension SessionController {
    /// The controller every front end makes: sessions as the command line says, desktop notifications.
    convenience init(arguments: Arguments, loop: EventLoop, logger: @escaping BackendLogger, notifier: DesktopNotifier? = DesktopNotifier.sessionBus()) {
        let setup = Setup(prepare: { invitation in
                              (makeDriver(invitation, arguments: arguments), sharingConfiguration(arguments, invitation: invitation, logger: logger))
                          },
                          exitStatus: { $0.exitStatus },
                          source: arguments.options.first { $0.key == "source" || $0.key == "scene" }.map { "\($0.key) \($0.value.serialized)" })
        self.init(setup: setup, loop: loop, logger: logger, notifier: notifier)
    }

    /// Starts a session with a join code's text, or the join code of the QR code in the picture at
    /// the absolute path `qr`. Returns nil once the session was started (its progress arrives as
    /// events), or why it was not.
    func connect(code: String?, qr: String?) -> ConnectRefusal? {
        guard !isActive else { return ConnectRefusal(Refusal.alreadySharing) }
        let text: String
        if let path = qr {
            guard path.hasPrefix("/") else { return ConnectRefusal(message: "connect: the QR picture's path must be absolute (the client makes it so)", status: ExitCode.daemonRefused) }
            switch readQRFile(path: path) {
            case .success(let found): text = found
            case .failure(let failure): return ConnectRefusal(message: failure.message, status: failure.status)
            }
        } else if let code {
            text = code
        } else {
            return ConnectRefusal(message: "connect needs \"code\" (the join code's text) or \"qr\" (a picture's path)", status: ExitCode.daemonRefused)
        }
        return connect(code: text).map(ConnectRefusal.init)
    }
}

/// Why a connect was not started: words for the person and the exit status (docs/exit-codes.md).
struct ConnectRefusal: Error {
    let message: String
    let status: Int32
}

extension ConnectRefusal {
    init(_ refusal: SessionController.Refusal) {
        self.init(message: refusal.message, status: refusal.reason.exitStatus)
    }
}
