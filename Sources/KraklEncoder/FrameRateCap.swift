import RateCap

/// `--max-fps`: when the encoder may take the next picture. A token bucket on the host's clock:
/// credit accrues with time, up to `burst` intervals' worth, and each picture taken spends one
/// interval of it; two pictures are never taken closer than `minimumSpacing` intervals.
///
/// Over any span of T seconds at most `burst + fps × T` pictures pass, so the long-run rate is
/// the cap (the earlier rule, "a capture ¾ of an interval after the last one passes", let a
/// 40 fps source through at 40). The stored credit is what keeps latency low: a source at the
/// cap whose frame comes a little early (capture jitter, or the previous take ran late) finds
/// credit left and is taken at once, and the credit comes back as soon as it is on time again,
/// instead of every later frame inheriting the wait (measured with a take-time-only rule:
/// capture → encoded drifted to 24 ms at 30 fps for a 5 ms encode).
///
/// Only the host's clock counts here: capture timestamps are the backend's and do not open the cap.
typealias FrameRateCap = TokenBucketCap
