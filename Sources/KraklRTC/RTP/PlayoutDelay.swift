import FoundationEssentials
import KraklBase

/// The range of delay a receiver may hold a frame before rendering it, as the playout-delay header
/// extension carries it (http://www.webrtc.org/experiments/rtp-hdrext/playout-delay: two 12-bit
/// values in 10 ms units, so 0 to 40.95 s).
///
/// Why a sender says so: libwebrtc receivers (Chromium) otherwise size a jitter buffer from the frame
/// arrival jitter they see, which on a loaded machine is tens of milliseconds a frame. A remote
/// desktop would rather show each frame at once; minimum = maximum = 0 asks for exactly that.
public struct PlayoutDelay: Sendable, Equatable {
    /// In 10 ms units, at most 4095.
    public let minimum: UInt16
    public let maximum: UInt16

    /// Render each frame as soon as it is decoded (no smoothing).
    public static let immediate = PlayoutDelay(uncheckedMinimum: 0, maximum: 0)

    /// - Parameters: each rounded down to 10 ms.
    /// - Returns: nil when `minimum` > `maximum`, either is negative or either is above 40.95 s.
    public init?(minimum: Duration, maximum: Duration) {
        let carried = Duration.zero ... .milliseconds(40_950)
        guard carried.contains(minimum), carried.contains(maximum), minimum <= maximum else { return nil }
        self.init(uncheckedMinimum: UInt16(minimum.inNanoseconds / 10_000_000), maximum: UInt16(maximum.inNanoseconds / 10_000_000))
    }

    private init(uncheckedMinimum: UInt16, maximum: UInt16) {
        minimum = uncheckedMinimum
        self.maximum = maximum
    }

    /// A setting's text (the viewer's `KRAKL_VIEWER_PLAYOUT_DELAY`): `off` is nil (leave the extension
    /// out), `MIN,MAX` milliseconds a range; nil or empty text is `immediate` (0,0). Unreadable text is
    /// `immediate` too, with the problem to tell the person (a typo must not pass unnoticed).
    public static func reading(_ text: String?) -> (delay: PlayoutDelay?, problem: String?) {
        guard let text = text?.trimmingSpaces(), !text.isEmpty else { return (.immediate, nil) }
        if text == "off" { return (nil, nil) }
        let parts = text.split(separator: ",", omittingEmptySubsequences: false).map { Int($0.trimmingSpaces()) }
        guard parts.count == 2, let low = parts[0], let high = parts[1],
              let delay = PlayoutDelay(minimum: .milliseconds(low), maximum: .milliseconds(high)) else {
            return (.immediate, "\"\(text.prefix(40))\" is not off or MIN,MAX milliseconds (0 <= MIN <= MAX <= 40950); using 0,0")
        }
        return (delay, nil)
    }

    public static func setting(_ text: String?) -> PlayoutDelay? { reading(text).delay }
}
