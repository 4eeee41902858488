import KraklBase
import Glibc
import KraklBackendABI

// The messages between the agent and krakl-backend-host (isolated mode), over an AF_UNIX
// SOCK_SEQPACKET socketpair: one message a datagram, so a message is never split or merged,
// and a short or oversized one is a protocol error rather than a resynchronisation problem.
// Fixed binary fields in the machine's byte order (both ends are the same build on the same
// machine); every count and length is bounded here and checked by the reader, and the agent
// reads everything the child sends as hostile input.

/// What a message is. Agent → child below 100, child → agent from 100.
public enum WireKind: UInt32, Sendable {
    case create = 1, start, stop, destroy, list, release
    /// The library loaded: ABI, whether it lists, name, description.
    case ready = 100
    /// The library did not load: a LoadFailure and its text.
    case loadFailed
    /// The answer to a command: call, status, last error line.
    case reply
    case log
    case event
    case sourceFound
    /// A new ring of frame slots; its memfd travels with the message (SCM_RIGHTS).
    case ring
    /// A frame is in a slot of the ring.
    case frame
    /// The backend delivered a frame the host could not use (its problem, the first time).
    case invalidFrame
}

/// Why the child could not load the library (the in-process loader's HostError cases).
public enum LoadFailure: UInt32, Sendable {
    case missing = 1, unloadable, entrySymbolMissing, abiMismatch
}

public enum WireLimits {
    /// Text a child may send in one field (log lines, error messages, names), in bytes.
    public static let maximumText = 4096
    /// Damage rectangles in one frame message; more are sent as their bounding box.
    public static let maximumRects = 512
    /// The largest message the child may send (two texts, the rectangles, the fixed fields).
    public static let maximumChildMessage = 2 * maximumText + maximumRects * 16 + 1024
    /// Options text the agent sends to create() or list_sources() (an AF_UNIX datagram must fit
    /// the socket's send buffer, about 208 KB by default).
    public static let maximumOptions = 64 * 1024
    public static let maximumSlots: UInt32 = 8
    /// A cursor image larger than this on a side travels without its pixels (the child warns
    /// once): room for it is in every slot (1 MiB), and even HiDPI cursors at 4x scale fit.
    public static let maximumCursorSide = 512
    public static let cursorBytes = maximumCursorSide * maximumCursorSide * 4
}

/// A message being written: fixed fields, then length-prefixed texts and arrays.
public struct WireWriter {
    public private(set) var bytes: [UInt8] = []

    public init(_ kind: WireKind) { u32(kind.rawValue) }

    public mutating func u32(_ value: UInt32) { withUnsafeBytes(of: value) { bytes.append(contentsOf: $0) } }
    public mutating func i32(_ value: Int32) { withUnsafeBytes(of: value) { bytes.append(contentsOf: $0) } }
    public mutating func u64(_ value: UInt64) { withUnsafeBytes(of: value) { bytes.append(contentsOf: $0) } }

    /// A text cut to `limit` bytes at a character boundary.
    public mutating func text(_ value: String, limit: Int = WireLimits.maximumText) {
        var utf8 = Array(value.utf8)
        if utf8.count > limit {
            var end = limit
            while end > 0 && utf8[end] & 0xC0 == 0x80 { end -= 1 }   // not inside a character
            utf8 = Array(utf8[..<end])
        }
        u32(UInt32(utf8.count))
        bytes.append(contentsOf: utf8)
    }
}

/// The fields that say what a frame's planes are, as both frame messages carry them.
public struct WireFrameShape: Equatable, Sendable {
    public var format: UInt32
    public var width: UInt32
    public var height: UInt32
    public var planeCount: UInt32
    /// Always KRAKL_MAX_PLANES of them.
    public var strides: [UInt32]
}

extension WireWriter {
    public mutating func shape(_ shape: WireFrameShape) {
        for value in [shape.format, shape.width, shape.height, shape.planeCount] { u32(value) }
        shape.strides.forEach { u32($0) }
    }

    public mutating func rect(_ r: krakl_rect) { [r.x, r.y, r.width, r.height].forEach { i32($0) } }
}

public struct WireError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// A received message, read with a bounds check on every field.
public struct WireReader {
    private let bytes: UnsafeRawBufferPointer
    private var offset = 0
    public let kind: WireKind

    public init(_ bytes: UnsafeRawBufferPointer) throws(WireError) {
        self.bytes = bytes
        var raw: UInt32 = 0
        guard bytes.count >= 4 else { throw WireError("a message of \(bytes.count) bytes") }
        raw = bytes.loadUnaligned(as: UInt32.self)
        offset = 4
        guard let kind = WireKind(rawValue: raw) else { throw WireError("unknown message kind \(raw)") }
        self.kind = kind
    }

    public var isAtEnd: Bool { offset == bytes.count }

    private mutating func take<T>(_: T.Type) throws(WireError) -> T {
        let size = MemoryLayout<T>.size
        guard bytes.count - offset >= size else { throw WireError("a \(kind) message ends early") }
        defer { offset += size }
        return bytes.loadUnaligned(fromByteOffset: offset, as: T.self)
    }

    public mutating func u32() throws(WireError) -> UInt32 { try take(UInt32.self) }
    public mutating func i32() throws(WireError) -> Int32 { try take(Int32.self) }
    public mutating func u64() throws(WireError) -> UInt64 { try take(UInt64.self) }

    public mutating func text(limit: Int = WireLimits.maximumText) throws(WireError) -> String {
        let count = Int(try u32())
        guard count <= limit else { throw WireError("a text of \(count) bytes in a \(kind) message (at most \(limit))") }
        guard bytes.count - offset >= count else { throw WireError("a \(kind) message ends inside a text") }
        defer { offset += count }
        return String(decoding: UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + count]), as: UTF8.self)
    }

    public mutating func shape() throws(WireError) -> WireFrameShape {
        let format = try u32(), width = try u32(), height = try u32(), planeCount = try u32()
        var strides: [UInt32] = []
        for _ in 0..<Int(KRAKL_MAX_PLANES) { strides.append(try u32()) }
        return WireFrameShape(format: format, width: width, height: height, planeCount: planeCount, strides: strides)
    }

    public mutating func rect() throws(WireError) -> krakl_rect {
        krakl_rect(x: try i32(), y: try i32(), width: try i32(), height: try i32())
    }

    /// Fails unless every byte was read: a message with trailing bytes is malformed.
    public func finish() throws(WireError) {
        guard isAtEnd else { throw WireError("\(bytes.count - offset) unexpected bytes after a \(kind) message") }
    }
}

/// One end of the socketpair.
public struct WireSocket: Sendable {
    public let fd: Int32

    public init(fd: Int32) { self.fd = fd }

    /// A connected pair, close-on-exec (the child's end is moved to fd 3 by posix_spawn).
    public static func pair() -> (WireSocket, WireSocket)? {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0 else { return nil }
        return (WireSocket(fd: fds[0]), WireSocket(fd: fds[1]))
    }

    /// Sends one message (and `passing`, a descriptor, with it). False when the peer is gone.
    /// Safe from several threads at once: a datagram is never interleaved with another.
    @discardableResult
    public func send(_ message: WireWriter, passing descriptor: Int32? = nil) -> Bool {
        message.bytes.withUnsafeBytes { body -> Bool in
            var vector = iovec(iov_base: UnsafeMutableRawPointer(mutating: body.baseAddress), iov_len: body.count)
            var header = msghdr()
            header.msg_iovlen = 1
            let controlSize = Int(cmsgSpace(MemoryLayout<Int32>.size))
            let control = UnsafeMutableRawPointer.allocate(byteCount: controlSize, alignment: 8)
            defer { control.deallocate() }
            if let descriptor {
                memset(control, 0, controlSize)
                let cmsg = control.assumingMemoryBound(to: cmsghdr.self)
                cmsg.pointee.cmsg_len = Int(cmsgLength(MemoryLayout<Int32>.size))
                cmsg.pointee.cmsg_level = SOL_SOCKET
                cmsg.pointee.cmsg_type = Int32(SCM_RIGHTS)
                (control + MemoryLayout<cmsghdr>.size).storeBytes(of: descriptor, as: Int32.self)
                header.msg_control = control
                header.msg_controllen = controlSize
            }
            while true {
                let sent = withUnsafeMutablePointer(to: &vector) { pointer -> Int in
                    header.msg_iov = pointer
                    return sendmsg(fd, &header, Int32(MSG_NOSIGNAL))
                }
                if sent >= 0 { return true }
                if errno != EINTR { return false }
            }
        }
    }

    public enum Received {
        case message(count: Int, descriptors: [Int32])
        /// The peer closed its end (or the message was larger than the buffer: `truncated`).
        case closed
        case truncated
    }

    /// Receives one message into `buffer`; descriptors that came with it arrive close-on-exec
    /// and are the caller's to close.
    public func receive(into buffer: UnsafeMutableRawBufferPointer) -> Received {
        var vector = iovec(iov_base: buffer.baseAddress, iov_len: buffer.count)
        let controlSize = Int(cmsgSpace(4 * MemoryLayout<Int32>.size))
        let control = UnsafeMutableRawPointer.allocate(byteCount: controlSize, alignment: 8)
        defer { control.deallocate() }
        while true {
            var header = msghdr()
            header.msg_control = control
            header.msg_controllen = controlSize
            let count = withUnsafeMutablePointer(to: &vector) { pointer -> Int in
                header.msg_iov = pointer
                header.msg_iovlen = 1
                return recvmsg(fd, &header, Int32(MSG_CMSG_CLOEXEC))
            }
            if count < 0 && errno == EINTR { continue }
            var descriptors: [Int32] = []
            var offset = 0
            // Every descriptor that arrived is collected, so none is leaked, whatever the message.
            while header.msg_controllen > 0 && offset + MemoryLayout<cmsghdr>.size <= Int(header.msg_controllen) {
                let cmsg = (control + offset).assumingMemoryBound(to: cmsghdr.self)
                let length = Int(cmsg.pointee.cmsg_len)
                guard length >= MemoryLayout<cmsghdr>.size, offset + length <= Int(header.msg_controllen) else { break }
                if cmsg.pointee.cmsg_level == SOL_SOCKET && cmsg.pointee.cmsg_type == Int32(SCM_RIGHTS) {
                    let n = (length - MemoryLayout<cmsghdr>.size) / MemoryLayout<Int32>.size
                    for i in 0..<n {
                        descriptors.append((control + MemoryLayout<cmsghdr>.size + i * 4).loadUnaligned(as: Int32.self))
                    }
                }
                offset += (length + 7) & ~7
            }
            if count <= 0 {
                descriptors.forEach { _ = Glibc.close($0) }
                return .closed
            }
            if header.msg_flags & Int32(MSG_TRUNC) != 0 || header.msg_flags & Int32(MSG_CTRUNC) != 0 {
                descriptors.forEach { _ = Glibc.close($0) }
                return .truncated
            }
            return .message(count: count, descriptors: descriptors)
        }
    }

    public func close() { _ = Glibc.close(fd) }
}

private func cmsgLength(_ data: Int) -> Int { MemoryLayout<cmsghdr>.size + data }
private func cmsgSpace(_ data: Int) -> Int { MemoryLayout<cmsghdr>.size + ((data + 7) & ~7) }
