import Glibc
import KraklBase
import KraklHost

/// The terminal under the home screen: raw mode (termios), the alternate screen, its size, and
/// drawing a page of lines by rewriting only the lines that changed (cursor addressing, no full
/// clear each second, so nothing flickers). No line is ever written into the last column, so
/// nothing wraps, at 80×24 or after a resize. Colours and bold only without NO_COLOR
/// (no-color.org: present and not empty turns them off).
final class TerminalScreen {
    let input: Int32
    let output: Int32
    let colour: Bool
    private(set) var rows = 24
    private(set) var columns = 80
    /// What each row shows now ("" for an empty row); empty after a resize, so all is drawn again.
    private var shown: [String] = []
    private var original: termios?

    /// The one screen in raw mode, for the exit paths that cannot reach it otherwise (atexit).
    nonisolated(unsafe) private static var active: TerminalScreen?

    init(input: Int32 = STDIN_FILENO, output: Int32 = STDOUT_FILENO, environment: [String: String]) {
        self.input = input
        self.output = output
        colour = (environment["NO_COLOR"] ?? "").isEmpty && environment["TERM"] != "dumb"
    }

    /// Both ends are terminals (what the home screen needs).
    static func available(input: Int32 = STDIN_FILENO, output: Int32 = STDOUT_FILENO) -> Bool {
        isatty(input) == 1 && isatty(output) == 1
    }

    /// Raw mode (no echo, no line editing; signals stay on, so Ctrl-C arrives as SIGINT through the
    /// agent's one signal path), the alternate screen, the cursor hidden. `restore` undoes all of
    /// it, and runs at exit too (an error path that calls exit()).
    func enter() throws(HostError) {
        var settings = termios()
        guard tcgetattr(input, &settings) == 0 else { throw .usage("the home screen needs a terminal (tcgetattr: \(String(cString: strerror(errno))))") }
        original = settings
        settings.c_lflag &= ~tcflag_t(ICANON | ECHO | IEXTEN)
        settings.c_iflag &= ~tcflag_t(IXON | ICRNL)
        withUnsafeMutableBytes(of: &settings.c_cc) { bytes in
            bytes[Int(VMIN)] = 1
            bytes[Int(VTIME)] = 0
            // No Ctrl-Z: a suspended screen would leave the shell in raw mode and come back unredrawn.
            bytes[Int(VSUSP)] = 0
        }
        guard tcsetattr(input, TCSANOW, &settings) == 0 else { throw .usage("cannot put the terminal in raw mode: \(String(cString: strerror(errno)))") }
        Self.active = self
        atexit { TerminalScreen.active?.restore() }
        write("\u{1B}[?1049h\u{1B}[?25l\u{1B}[H\u{1B}[2J")
        measure()
    }

    /// The terminal as it was; safe to call more than once.
    func restore() {
        guard var settings = original else { return }
        original = nil
        write("\u{1B}[0m\u{1B}[?25h\u{1B}[?1049l")
        _ = tcsetattr(input, TCSANOW, &settings)
        if Self.active === self { Self.active = nil }
    }

    /// Reads the size again (after SIGWINCH); everything is drawn again on the next `draw`.
    func measure() {
        var size = winsize()
        if ioctl(output, UInt(TIOCGWINSZ), &size) == 0, size.ws_row > 0, size.ws_col > 0 {
            rows = Int(size.ws_row)
            columns = Int(size.ws_col)
        }
        shown = []
        write("\u{1B}[H\u{1B}[2J")
    }

    /// Shows `lines` (already fitted to the width: see `fit`), each at its row; rows past them are
    /// emptied. With `cursor`, the cursor is shown there (row, column from 0), else hidden.
    func draw(_ lines: [String], cursor: (row: Int, column: Int)? = nil) {
        var page = Array(lines.prefix(rows))
        page += Array(repeating: "", count: rows - page.count)
        if shown.count != rows { shown = Array(repeating: "\u{0}", count: rows) }
        var bytes = "\u{1B}[?25l"
        for (row, line) in page.enumerated() where shown[row] != line {
            bytes += "\u{1B}[\(row + 1);1H" + line + (colour ? "\u{1B}[0m" : "") + "\u{1B}[K"
            shown[row] = line
        }
        if let cursor { bytes += "\u{1B}[\(cursor.row + 1);\(cursor.column + 1)H\u{1B}[?25h" }
        write(bytes)
    }

    /// `text` cut to the width less one column (the last column would make some terminals wrap).
    func fit(_ text: String) -> String {
        let room = max(1, columns - 1)
        return text.count <= room ? text : String(text.prefix(room - 1)) + "…"
    }

    /// `text` broken at spaces into lines that fit, at most `limit` of them; the first line starts
    /// with `label`, the others with as many spaces.
    func wrap(_ text: String, label: String = "", limit: Int = 3) -> [String] {
        let indent = String(repeating: " ", count: label.count)
        let room = max(10, columns - 1 - label.count)
        var lines: [String] = []
        var current = ""
        for word in text.split(separator: " ") {
            if current.isEmpty { current = String(word) } else if current.count + 1 + word.count <= room { current += " " + word } else {
                lines.append(current)
                current = String(word)
            }
        }
        if !current.isEmpty { lines.append(current) }
        if lines.count > limit { lines = Array(lines.prefix(limit)) }
        return lines.enumerated().map { fit(($0.offset == 0 ? label : indent) + $0.element) }
    }

    /// Bold (and a colour) around `text`, unless colours are off. Call after `fit`: the codes take no room.
    func emphasis(_ text: String, colour code: Int? = nil) -> String {
        guard colour else { return text }
        return "\u{1B}[1" + (code.map { ";\($0)" } ?? "") + "m" + text + "\u{1B}[0m"
    }

    private func write(_ text: String) {
        var bytes = Array(text.utf8)[...]
        var attempts = 0
        while !bytes.isEmpty && attempts < 1000 {
            attempts += 1
            let n = bytes.withUnsafeBytes { Glibc.write(output, $0.baseAddress, $0.count) }
            if n < 0 && (errno == EINTR || errno == EAGAIN) { continue }
            guard n > 0 else { return }
            bytes = bytes.dropFirst(n)
        }
    }
}
