import Glibc

/// Typed, strict reading of a backend's options: each accessor either
/// returns a value in range or throws an error naming the option and what
/// it accepts.
public struct OptionReader {
    public let host: BackendHost

    /// Validates the option keys first: a misspelt option must be an error.
    public init(host: BackendHost, known: [String]) throws(BackendError) {
        self.host = host
        try host.checkOptions(known: known)
    }

    public func integer(_ key: String, default value: Int, in range: ClosedRange<Int>) throws(BackendError) -> Int {
        guard let text = host.option(key) else { return value }
        guard let number = Int(text), range.contains(number) else {
            throw .invalidOption("option \(key)=\(text) is not valid: give a whole number from \(range.lowerBound) to \(range.upperBound)")
        }
        return number
    }

    public func number(_ key: String, default value: Double, in range: ClosedRange<Double>) throws(BackendError) -> Double {
        guard let text = host.option(key) else { return value }
        guard let number = Double(text), range.contains(number) else {
            throw .invalidOption("option \(key)=\(text) is not valid: give a number from \(range.lowerBound) to \(range.upperBound)")
        }
        return number
    }

    public func choice(_ key: String, default value: String, from allowed: [String]) throws(BackendError) -> String {
        guard let text = host.option(key) else { return value }
        guard allowed.contains(text) else {
            throw .invalidOption("option \(key)=\(text) is not valid: use one of \(allowed.joined(separator: ", "))")
        }
        return text
    }

    public func string(_ key: String) -> String? {
        host.option(key).flatMap { $0 == "null" ? nil : $0 }
    }

    public func bool(_ key: String, default value: Bool) throws(BackendError) -> Bool {
        guard let text = host.option(key) else { return value }
        switch text {
        case "true": return true
        case "false": return false
        default: throw .invalidOption("option \(key)=\(text) is not valid: use true or false")
        }
    }
}
