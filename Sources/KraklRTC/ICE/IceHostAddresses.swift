import Glibc

/// Which local addresses ICE may gather host candidates on.
public struct IceAddressPolicy: Sendable {
    /// Only these addresses (when set); every other interface address is ignored.
    public var allowed: [IPAddress]?
    /// 127.0.0.0/8 and ::1: off by default (a peer elsewhere can never reach them);
    /// tests turn it on, or list 127.0.0.2 in `allowed`, which implies it.
    public var includeLoopback = false
    public var includeIPv6 = true

    public init(allowed: [IPAddress]? = nil, includeLoopback: Bool = false, includeIPv6: Bool = true) {
        self.allowed = allowed
        self.includeLoopback = includeLoopback
        self.includeIPv6 = includeIPv6
    }

    /// Whether an interface address may become a host candidate.
    public func admits(_ ip: IPAddress) -> Bool {
        if let allowed { return allowed.contains(ip) && (includeIPv6 || !ip.isIPv6) }
        if ip.isLinkLocal { return false }            // needs a scope id
        if ip.isLoopback && !includeLoopback { return false }
        if ip.isIPv6 && !includeIPv6 { return false }
        return true
    }
}

public enum IceHostAddresses {
    /// Addresses of interfaces that are up (getifaddrs), filtered by `policy`, IPv4
    /// first, without duplicates. An address listed in `policy.allowed` that no
    /// interface carries is left out (bind would fail on it).
    public static func gather(_ policy: IceAddressPolicy) -> [IPAddress] {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0, let first = list else { return [] }
        defer { freeifaddrs(list) }
        var found: [IPAddress] = []
        var cursor: UnsafeMutablePointer<ifaddrs>? = first
        while let entry = cursor {
            defer { cursor = entry.pointee.ifa_next }
            guard entry.pointee.ifa_flags & UInt32(IFF_UP) != 0, let address = entry.pointee.ifa_addr else { continue }
            var storage = sockaddr_storage()
            let family = Int32(address.pointee.sa_family)
            guard family == AF_INET || family == AF_INET6 else { continue }
            let size = family == AF_INET ? MemoryLayout<sockaddr_in>.size : MemoryLayout<sockaddr_in6>.size
            withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: UnsafeRawBufferPointer(start: address, count: size)) }
            guard let ip = UdpSocket.transportAddress(storage)?.ip, policy.admits(ip), !found.contains(ip) else { continue }
            found.append(ip)
        }
        return found.filter { !$0.isIPv6 } + found.filter(\.isIPv6)
    }
}
