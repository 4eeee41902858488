import Dispatch
import FoundationEssentials
import KraklBase
import Glibc
import KraklRTC

/// Host names to addresses with getaddrinfo (A and AAAA, as /etc/nsswitch.conf says: hosts file,
/// DNS), each lookup on a thread of its own so a slow or absent resolver costs at most `timeout`
/// to whoever waits (getaddrinfo itself cannot be cancelled; a late thread just finishes alone).
public enum HostNameResolver {
    /// Why a name gave no address.
    public enum Failure: Error, Equatable, Sendable, CustomStringConvertible {
        /// getaddrinfo answered: no such name, no address, or a resolver error (its text).
        case noAddress(name: String, reason: String)
        /// No answer within the time allowed.
        case timedOut(name: String, seconds: Double)

        public var description: String {
            switch self {
            case .noAddress(let name, let reason): return "the name \(name) does not resolve (\(reason))"
            case .timedOut(let name, let seconds): return "the name \(name) did not resolve within \(Self.format(seconds)) s"
            }
        }

        private static func format(_ seconds: Double) -> String {
            seconds == seconds.rounded() ? "\(Int(seconds))" : String(cFormat: "%.1f", seconds)
        }
    }

    /// Every distinct address of each name (IPv4 first, in resolver order), all looked up at
    /// once and waited for together: the whole call returns within about `timeout`.
    public static func resolve(_ names: [String], timeout: Duration) -> [String: Result<[IPAddress], Failure>] {
        let unique = Array(Set(names))
        let lookups = unique.map { name in (name, Lookup(name: name)) }
        let deadline = DispatchTime.now() + timeout.inSeconds
        var results: [String: Result<[IPAddress], Failure>] = [:]
        for (name, lookup) in lookups {
            results[name] = lookup.wait(until: deadline) ?? .failure(.timedOut(name: name, seconds: timeout.inSeconds))
        }
        return results
    }

    /// One name's lookup on its thread; the result is kept under a lock for whoever waits.
    private final class Lookup: Sendable {
        private let done = DispatchSemaphore(value: 0)
        private let result = Guarded<Result<[IPAddress], Failure>?>(nil)

        init(name: String) {
            startThread(name: "krakl-resolve") { [self] in
                let answer = HostNameResolver.lookUp(name)
                result.withLock { $0 = answer }
                done.signal()
            }
        }

        func wait(until deadline: DispatchTime) -> Result<[IPAddress], Failure>? {
            guard done.wait(timeout: deadline) == .success else { return nil }
            return result.withLock { $0 }
        }
    }

    /// The blocking part: getaddrinfo for datagram addresses of any family.
    static func lookUp(_ name: String) -> Result<[IPAddress], Failure> {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_DGRAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(name, nil, &hints, &list)
        guard status == 0 else {
            let reason = status == EAI_SYSTEM ? String(cString: strerror(errno)) : String(cString: gai_strerror(status))
            return .failure(.noAddress(name: name, reason: reason))
        }
        defer { freeaddrinfo(list) }
        var v4: [IPAddress] = [], v6: [IPAddress] = []
        var entry = list
        while let info = entry?.pointee {
            defer { entry = info.ai_next }
            guard let sockaddr = info.ai_addr else { continue }
            switch Int32(sockaddr.pointee.sa_family) {
            case AF_INET:
                let raw = UnsafeRawPointer(sockaddr).load(as: sockaddr_in.self)
                let address = IPAddress.v4(withUnsafeBytes(of: raw.sin_addr) { Array($0) })
                if !v4.contains(address) { v4.append(address) }
            case AF_INET6:
                let raw = UnsafeRawPointer(sockaddr).load(as: sockaddr_in6.self)
                let address = IPAddress.v6(withUnsafeBytes(of: raw.sin6_addr) { Array($0) })
                if !v6.contains(address) { v6.append(address) }
            default:
                continue
            }
        }
        guard !(v4 + v6).isEmpty else { return .failure(.noAddress(name: name, reason: "no IPv4 or IPv6 address")) }
        return .success(v4 + v6)
    }
}
