import Glibc

/// Why a socket could not be made or used.
public enum NetworkError: Error, Equatable, Sendable, CustomStringConvertible {
    case socket(String)
    case noAddresses(String)

    public var description: String {
        switch self {
        case .socket(let text): return "network: \(text)"
        case .noAddresses(let text): return "ICE has no local address to use: \(text)"
        }
    }
}

/// A non-blocking UDP socket bound to one local address (IPv4 or IPv6):
/// the base of one host candidate. Owned by the event loop's thread.
public final class UdpSocket {
    /// The descriptor, or -1 once closed.
    public private(set) var fd: Int32
    /// The bound address with the port the kernel chose.
    public let localAddress: TransportAddress
    /// Datagrams the kernel refused (EAGAIN: send buffer full; other errors).
    public private(set) var sendFailures = 0

    /// socket + bind + O_NONBLOCK; 1 MB buffers so a keyframe burst fits.
    /// With `reportsErrors` the kernel queues the ICMP errors our datagrams caused (IP_RECVERR): an
    /// unconnected socket hears of them no other way. The owner must then drain `receiveError()`
    /// whenever the socket polls ready (a queued error keeps it ready).
    public init(bindTo ip: IPAddress, port: UInt16 = 0, reportsErrors: Bool = false) throws(NetworkError) {
        let family = ip.isIPv6 ? AF_INET6 : AF_INET
        let fd = socket(family, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw NetworkError.socket("socket(): \(String(cString: strerror(errno)))") }
        var size: Int32 = 1 << 20
        _ = setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        _ = setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        if ip.isIPv6 {
            var one: Int32 = 1
            _ = setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &one, socklen_t(MemoryLayout<Int32>.size))
        }
        if reportsErrors {
            var one: Int32 = 1
            if ip.isIPv6 {
                _ = setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_RECVERR, &one, socklen_t(MemoryLayout<Int32>.size))
            } else {
                _ = setsockopt(fd, Int32(IPPROTO_IP), IP_RECVERR, &one, socklen_t(MemoryLayout<Int32>.size))
            }
        }
        var storage = UdpSocket.sockaddr(TransportAddress(ip: ip, port: port))
        let bound = withUnsafePointer(to: &storage.address) {
            $0.withMemoryRebound(to: Glibc.sockaddr.self, capacity: 1) { bind(fd, $0, storage.length) }
        }
        guard bound == 0 else {
            let text = String(cString: strerror(errno))
            Glibc.close(fd)
            throw NetworkError.socket("bind(\(TransportAddress(ip: ip, port: port))): \(text)")
        }
        var actual = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: Glibc.sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        self.fd = fd
        localAddress = UdpSocket.transportAddress(actual) ?? TransportAddress(ip: ip, port: port)
    }

    deinit { close() }

    public var isClosed: Bool { fd < 0 }

    /// Closes the descriptor now (the owner is done with it); later sends fail and receives return nil.
    public func close() {
        guard fd >= 0 else { return }
        Glibc.close(fd)
        fd = -1
    }

    /// Sends one datagram; false when the kernel refused it (counted, never blocks).
    @discardableResult
    public func send(_ datagram: [UInt8], to peer: TransportAddress) -> Bool {
        guard fd >= 0 else { sendFailures += 1; return false }
        var storage = UdpSocket.sockaddr(peer)
        var sent = -1
        // A pending ICMP error of an earlier datagram (IP_RECVERR) fails one sendto; this datagram is not the one refused.
        for _ in 0..<2 {
            sent = datagram.withUnsafeBytes { bytes in
                withUnsafePointer(to: &storage.address) {
                    $0.withMemoryRebound(to: Glibc.sockaddr.self, capacity: 1) {
                        sendto(fd, bytes.baseAddress, bytes.count, 0, $0, storage.length)
                    }
                }
            }
            guard sent < 0, [ECONNREFUSED, EHOSTUNREACH, ENETUNREACH].contains(errno) else { break }
        }
        if sent != datagram.count { sendFailures += 1; return false }
        return true
    }

    /// One waiting datagram, or nil when none is (EAGAIN). `buffer` is reused between calls.
    public func receive(_ buffer: inout [UInt8]) -> (bytes: [UInt8], from: TransportAddress)? {
        guard fd >= 0 else { return nil }
        var from = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        var count = -1
        // A pending ICMP error (IP_RECVERR) fails one recvfrom; the datagrams behind it are still there.
        for _ in 0..<2 {
            count = buffer.withUnsafeMutableBytes { bytes in
                withUnsafeMutablePointer(to: &from) {
                    $0.withMemoryRebound(to: Glibc.sockaddr.self, capacity: 1) { recvfrom(fd, bytes.baseAddress, bytes.count, 0, $0, &length) }
                }
            }
            guard count < 0, [ECONNREFUSED, EHOSTUNREACH, ENETUNREACH].contains(errno) else { break }
        }
        guard count >= 0, let address = UdpSocket.transportAddress(from) else { return nil }
        return (Array(buffer[0..<count]), address)
    }

    /// An error the kernel queued for a datagram we sent (`reportsErrors`): where that datagram
    /// went and the errno (ECONNREFUSED for an ICMP port unreachable), or nil when none is queued.
    /// Wraps recvmsg(MSG_ERRQUEUE) and reads the IP_RECVERR / IPV6_RECVERR `sock_extended_err`.
    public func receiveError() -> (destination: TransportAddress, code: Int32)? {
        guard fd >= 0 else { return nil }
        var destination = sockaddr_storage()
        var payload = [UInt8](repeating: 0, count: 64)
        var control = [UInt8](repeating: 0, count: 256)
        let received: Int = payload.withUnsafeMutableBytes { payloadBytes in
            control.withUnsafeMutableBytes { controlBytes in
                withUnsafeMutablePointer(to: &destination) { name in
                    var vector = iovec(iov_base: payloadBytes.baseAddress, iov_len: payloadBytes.count)
                    return withUnsafeMutablePointer(to: &vector) { vectorPointer in
                        var header = msghdr()
                        header.msg_name = UnsafeMutableRawPointer(name)
                        header.msg_namelen = socklen_t(MemoryLayout<sockaddr_storage>.size)
                        header.msg_iov = vectorPointer
                        header.msg_iovlen = 1
                        header.msg_control = controlBytes.baseAddress
                        header.msg_controllen = controlBytes.count
                        guard recvmsg(fd, &header, Int32(MSG_ERRQUEUE) | Int32(MSG_DONTWAIT)) >= 0 else { return -1 }
                        return Int(header.msg_controllen)
                    }
                }
            }
        }
        guard received > 0, let address = UdpSocket.transportAddress(destination) else { return nil }
        // cmsghdr (length, level, type) then the data, aligned to size_t; CMSG_* are macros Swift cannot call.
        let headerSize = MemoryLayout<cmsghdr>.size
        var offset = 0
        while offset + headerSize <= received {
            let (length, level, type) = control.withUnsafeBytes { bytes in
                (bytes.loadUnaligned(fromByteOffset: offset, as: Int.self),
                 bytes.loadUnaligned(fromByteOffset: offset + MemoryLayout<Int>.size, as: Int32.self),
                 bytes.loadUnaligned(fromByteOffset: offset + MemoryLayout<Int>.size + 4, as: Int32.self))
            }
            guard length >= headerSize, offset + length <= received else { break }
            let isRecvErr = (level == Int32(IPPROTO_IP) && type == Int32(IP_RECVERR))
                || (level == Int32(IPPROTO_IPV6) && type == Int32(IPV6_RECVERR))
            // sock_extended_err starts with ee_errno (u32).
            if isRecvErr, length >= headerSize + 4 {
                let code = control.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: offset + headerSize, as: UInt32.self) }
                return (address, Int32(bitPattern: code))
            }
            offset += (length + MemoryLayout<Int>.size - 1) & ~(MemoryLayout<Int>.size - 1)
        }
        return (address, 0)
    }

    // MARK: sockaddr conversions

    static func sockaddr(_ address: TransportAddress) -> (address: sockaddr_storage, length: socklen_t) {
        var storage = sockaddr_storage()
        switch address.ip {
        case .v4(let bytes):
            withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { sin in
                    sin.pointee.sin_family = sa_family_t(AF_INET)
                    sin.pointee.sin_port = address.port.bigEndian
                    withUnsafeMutableBytes(of: &sin.pointee.sin_addr) { $0.copyBytes(from: bytes.prefix(4)) }
                }
            }
            return (storage, socklen_t(MemoryLayout<sockaddr_in>.size))
        case .v6(let bytes):
            withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { sin6 in
                    sin6.pointee.sin6_family = sa_family_t(AF_INET6)
                    sin6.pointee.sin6_port = address.port.bigEndian
                    withUnsafeMutableBytes(of: &sin6.pointee.sin6_addr) { $0.copyBytes(from: bytes.prefix(16)) }
                }
            }
            return (storage, socklen_t(MemoryLayout<sockaddr_in6>.size))
        }
    }

    static func transportAddress(_ storage: sockaddr_storage) -> TransportAddress? {
        var storage = storage
        switch Int32(storage.ss_family) {
        case AF_INET:
            return withUnsafePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { sin in
                    var address = sin.pointee.sin_addr
                    let bytes = withUnsafeBytes(of: &address) { Array($0) }
                    return TransportAddress(ip: .v4(bytes), port: UInt16(bigEndian: sin.pointee.sin_port))
                }
            }
        case AF_INET6:
            return withUnsafePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { sin6 in
                    var address = sin6.pointee.sin6_addr
                    let bytes = withUnsafeBytes(of: &address) { Array($0) }
                    return TransportAddress(ip: .v6(bytes), port: UInt16(bigEndian: sin6.pointee.sin6_port))
                }
            }
        default:
            return nil
        }
    }
}

extension IPAddress {
    /// 127.0.0.0/8 or ::1.
    public var isLoopback: Bool {
        switch self {
        case .v4(let b): return b.first == 127
        case .v6(let b): return b == [UInt8](repeating: 0, count: 15) + [1]
        }
    }

    /// fe80::/10: needs a scope id to be usable, never gathered.
    public var isLinkLocal: Bool {
        switch self {
        case .v4(let b): return b.count == 4 && b[0] == 169 && b[1] == 254
        case .v6(let b): return b.count == 16 && b[0] == 0xfe && b[1] & 0xc0 == 0x80
        }
    }
}
