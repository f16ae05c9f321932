//! W3C trace context: where a call stands in a distributed trace.
//!
//! A [`TraceContext`] is what the `traceparent` and `tracestate` headers of
//! the W3C Trace Context recommendation carry: a trace id shared by every
//! span of one trace, the id of the span that sent it, and whether the trace
//! is sampled. A call arriving with a valid `traceparent` continues that
//! trace; one without (or with a header that does not parse) starts a new
//! one. A job carries the context of the dispatcher's span that enqueued it
//! (stored with the job, and sent beside its id in the broker's message), so
//! the worker that runs it continues the same trace.
//!
//! Parsing is strict (version `00`, lowercase hex of the right lengths, ids
//! not all zero) and never fails loudly: a header that is not valid is no
//! context at all, and the call starts a new trace.

use std::fmt;

use rand::Rng;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest `tracestate` kept, in bytes (the recommendation's bound).
pub const MAX_TRACESTATE: usize = 512;

/// The most list members a `tracestate` may have.
const MAX_TRACESTATE_MEMBERS: usize = 32;

/// The `sampled` bit of the trace flags.
const SAMPLED: u8 = 0x01;

/// One span's place in a trace: trace id, span id, sampled flag and the
/// vendors' `tracestate`, as the `traceparent` and `tracestate` headers
/// carry them. The ids are never all zero.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    sampled: bool,
    state: Option<String>,
}

impl TraceContext {
    /// The context of `traceparent` (with `tracestate`, kept when it is
    /// well formed), or `None` when `traceparent` is not a valid version-00
    /// header: `00-<32 hex>-<16 hex>-<2 hex>`, lowercase, ids not all zero.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let bytes = traceparent.trim().as_bytes();
        if bytes.len() != 55 || [2, 35, 52].iter().any(|&i| bytes[i] != b'-') {
            return None;
        }
        if &bytes[..2] != b"00" {
            return None;
        }
        let trace_id: [u8; 16] = decode_hex(&bytes[3..35])?;
        let span_id: [u8; 8] = decode_hex(&bytes[36..52])?;
        let [flags]: [u8; 1] = decode_hex(&bytes[53..55])?;
        TraceContext::from_ids(
            trace_id,
            span_id,
            flags & SAMPLED != 0,
            tracestate.and_then(valid_tracestate),
        )
    }

    /// The context a request's headers carry: exactly one `traceparent`
    /// value, valid, with its `tracestate` values joined as one list; else
    /// `None` (two `traceparent`s are not a trace to continue).
    pub fn from_headers<'a>(
        traceparents: impl IntoIterator<Item = &'a str>,
        tracestates: impl IntoIterator<Item = &'a str>,
    ) -> Option<TraceContext> {
        let mut traceparents = traceparents.into_iter();
        let traceparent = traceparents.next()?;
        if traceparents.next().is_some() {
            return None;
        }
        let states: Vec<&str> = tracestates.into_iter().collect();
        let state = (!states.is_empty()).then(|| states.join(","));
        TraceContext::parse(traceparent, state.as_deref())
    }

    /// A context of these ids, or `None` when either is all zero. A
    /// `tracestate` that is not well formed is dropped.
    pub fn from_ids(
        trace_id: [u8; 16],
        span_id: [u8; 8],
        sampled: bool,
        tracestate: Option<String>,
    ) -> Option<TraceContext> {
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            sampled,
            state: tracestate.as_deref().and_then(valid_tracestate),
        })
    }

    /// The first span of a new trace: random ids, sampled.
    pub fn new_root() -> TraceContext {
        TraceContext::root_from(&mut rand::rng())
    }

    /// A new span of the same trace under this one: a fresh span id, the
    /// same trace id, flags and `tracestate`.
    pub fn child(&self) -> TraceContext {
        self.child_from(&mut rand::rng())
    }

    /// A root whose 24 bytes of ids are drawn from `rng` at once (the
    /// thread's generator: no system call per id), again while either id
    /// is all zero.
    fn root_from(rng: &mut impl Rng) -> TraceContext {
        loop {
            let mut ids = [0u8; 24];
            rng.fill_bytes(&mut ids);
            let (mut trace_id, mut span_id) = ([0u8; 16], [0u8; 8]);
            trace_id.copy_from_slice(&ids[..16]);
            span_id.copy_from_slice(&ids[16..]);
            if let Some(root) = TraceContext::from_ids(trace_id, span_id, true, None) {
                return root;
            }
        }
    }

    /// A child whose span id is drawn from `rng`, again while it is all
    /// zero or this span's own.
    fn child_from(&self, rng: &mut impl Rng) -> TraceContext {
        loop {
            let mut span_id = [0u8; 8];
            rng.fill_bytes(&mut span_id);
            if span_id != [0; 8] && span_id != self.span_id {
                return TraceContext {
                    span_id,
                    ..self.clone()
                };
            }
        }
    }

    /// The trace id, 32 lowercase hex digits.
    pub fn trace_id(&self) -> String {
        hex_string(&self.trace_id)
    }

    /// The span id, 16 lowercase hex digits.
    pub fn span_id(&self) -> String {
        hex_string(&self.span_id)
    }

    /// The trace id as 16 bytes.
    pub fn trace_id_bytes(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The span id as 8 bytes.
    pub fn span_id_bytes(&self) -> [u8; 8] {
        self.span_id
    }

    /// Whether the trace is sampled (recorded by whoever exports it).
    pub fn is_sampled(&self) -> bool {
        self.sampled
    }

    /// The `traceparent` header of this context.
    pub fn traceparent(&self) -> String {
        // Written into one string of its length: made for every job.
        let mut header = String::with_capacity(55);
        header.push_str("00-");
        push_hex(&mut header, &self.trace_id);
        header.push('-');
        push_hex(&mut header, &self.span_id);
        header.push('-');
        push_hex(&mut header, &[if self.sampled { SAMPLED } else { 0 }]);
        header
    }

    /// The `tracestate` header received with the trace, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.state.as_deref()
    }
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceContext")
            .field("traceparent", &self.traceparent())
            .field("tracestate", &self.state)
            .finish()
    }
}

/// `bytes` as lowercase hex digits, two a byte.
fn hex_string(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(2 * bytes.len());
    push_hex(&mut out, bytes);
    out
}

/// Appends `bytes` to `out` as lowercase hex digits, two a byte.
fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

/// `N` bytes of exactly `2 * N` lowercase hex digits.
fn decode_hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// `tracestate` when it is a well-formed list: at most 512 bytes of
/// printable ASCII, at most 32 members, each `key=value` with a key and a
/// value. Opaque beyond that: it is passed on, never read.
fn valid_tracestate(state: &str) -> Option<String> {
    let state = state.trim();
    if state.is_empty()
        || state.len() > MAX_TRACESTATE
        || !state.bytes().all(|b| (0x20..=0x7e).contains(&b))
    {
        return None;
    }
    let members: Vec<&str> = state
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .collect();
    let well_formed = members.iter().all(|member| {
        member
            .split_once('=')
            .is_some_and(|(key, value)| !key.is_empty() && !value.is_empty() && !key.contains(' '))
    });
    (well_formed && !members.is_empty() && members.len() <= MAX_TRACESTATE_MEMBERS)
        .then(|| state.to_owned())
}

/// How a context is written where JSON holds it: its two headers.
#[derive(Serialize, Deserialize)]
struct Headers {
    traceparent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tracestate: Option<String>,
}

impl Serialize for TraceContext {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Headers {
            traceparent: self.traceparent(),
            tracestate: self.state.clone(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for TraceContext {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let headers = Headers::deserialize(deserializer)?;
        TraceContext::parse(&headers.traceparent, headers.tracestate.as_deref()).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "`{}` is not a version-00 traceparent",
                crate::registry::truncate(&headers.traceparent, 64)
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn ids_are_written_as_lowercase_hex_of_their_bytes() {
        for _ in 0..64 {
            let context = TraceContext::new_root();
            let (trace, span) = (context.trace_id_bytes(), context.span_id_bytes());
            assert_eq!(context.trace_id(), hex::encode(trace));
            assert_eq!(context.span_id(), hex::encode(span));
            let header = format!("00-{}-{}-01", hex::encode(trace), hex::encode(span));
            assert_eq!(context.traceparent(), header);
        }
    }

    #[test]
    fn a_valid_traceparent_reads_back_as_written() {
        let context = TraceContext::parse(VALID, Some("congo=t61rcWkgMzE")).expect("valid");
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.span_id(), "00f067aa0ba902b7");
        assert!(context.is_sampled());
        assert_eq!(context.traceparent(), VALID);
        assert_eq!(context.tracestate(), Some("congo=t61rcWkgMzE"));
        let unsampled =
            TraceContext::parse(&VALID.replace("-01", "-00"), None).expect("unsampled is valid");
        assert!(!unsampled.is_sampled());
        assert!(unsampled.traceparent().ends_with("-00"));
        // Surrounding whitespace is the header's, not the value's.
        assert!(TraceContext::parse(&format!(" {VALID} "), None).is_some());
        // Flags other than sampled are not passed on.
        let flagged = TraceContext::parse(&VALID.replace("-01", "-03"), None).unwrap();
        assert!(flagged.traceparent().ends_with("-01"));
    }

    #[test]
    fn other_versions_are_refused() {
        for version in ["01", "ff", "0x", "  "] {
            let header = format!("{version}{}", &VALID[2..]);
            assert_eq!(TraceContext::parse(&header, None), None, "{header}");
        }
    }

    #[test]
    fn wrong_lengths_and_separators_are_refused() {
        let bad = [
            "",
            "00",
            // trace id one digit short, then one digit long
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47366-00f067aa0ba902b7-01",
            // span id one digit short, then one digit long
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b77-01",
            // flags one digit, then three
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",
            // a field more, separators moved or missing, not hex
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-00",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "004bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
        ];
        for header in bad {
            assert_eq!(TraceContext::parse(header, None), None, "{header:?}");
        }
    }

    #[test]
    fn all_zero_ids_are_refused() {
        let zero_trace = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        let zero_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
        assert_eq!(TraceContext::parse(zero_trace, None), None);
        assert_eq!(TraceContext::parse(zero_span, None), None);
        assert_eq!(TraceContext::from_ids([0; 16], [1; 8], true, None), None);
        assert_eq!(TraceContext::from_ids([1; 16], [0; 8], true, None), None);
    }

    #[test]
    fn uppercase_hex_is_refused() {
        let upper_trace = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
        let upper_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01";
        let upper_flags = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A";
        for header in [upper_trace, upper_span, upper_flags] {
            assert_eq!(TraceContext::parse(header, None), None, "{header}");
        }
    }

    #[test]
    fn a_bad_tracestate_is_dropped_and_the_traceparent_kept() {
        let long = format!("k={}", "v".repeat(MAX_TRACESTATE));
        let many = (0..33).map(|i| format!("k{i}=v")).collect::<Vec<_>>();
        for state in [
            "",
            "no-equals",
            "=v",
            "k=",
            "k=\u{e9}",
            &long,
            &many.join(","),
        ] {
            let context = TraceContext::parse(VALID, Some(state)).expect("traceparent kept");
            assert_eq!(context.tracestate(), None, "{state:?}");
        }
        let kept = TraceContext::parse(VALID, Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"));
        assert_eq!(
            kept.unwrap().tracestate(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
    }

    #[test]
    fn new_traces_and_children() {
        let root = TraceContext::new_root();
        assert!(root.is_sampled());
        assert_eq!(
            TraceContext::parse(&root.traceparent(), None),
            Some(root.clone())
        );
        assert_ne!(TraceContext::new_root().trace_id(), root.trace_id());
        let child = root.child();
        assert_eq!(child.trace_id(), root.trace_id());
        assert_ne!(child.span_id(), root.span_id());
        let with_state = TraceContext::parse(VALID, Some("a=b")).unwrap().child();
        assert_eq!(with_state.tracestate(), Some("a=b"));
        assert_eq!(with_state.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    /// Hands out its bytes in order, then zeros, counting its draws.
    struct Scripted {
        bytes: Vec<u8>,
        draws: usize,
    }

    impl Scripted {
        fn new(bytes: impl IntoIterator<Item = u8>) -> Scripted {
            Scripted {
                bytes: bytes.into_iter().collect(),
                draws: 0,
            }
        }
    }

    impl rand::TryRng for Scripted {
        type Error = std::convert::Infallible;

        fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
            let mut word = [0; 4];
            self.try_fill_bytes(&mut word)?;
            Ok(u32::from_le_bytes(word))
        }

        fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
            let mut word = [0; 8];
            self.try_fill_bytes(&mut word)?;
            Ok(u64::from_le_bytes(word))
        }

        fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
            self.draws += 1;
            let n = dst.len().min(self.bytes.len());
            dst.fill(0);
            dst[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes.drain(..n);
            Ok(())
        }
    }

    #[test]
    fn ids_are_drawn_from_the_generator_24_bytes_at_once_and_never_zero() {
        let mut rng = Scripted::new(1..=24);
        let root = TraceContext::root_from(&mut rng);
        assert_eq!(rng.draws, 1, "one draw for both ids");
        assert_eq!(
            root.trace_id_bytes().to_vec(),
            (1..=16).collect::<Vec<u8>>()
        );
        assert_eq!(
            root.span_id_bytes().to_vec(),
            (17..=24).collect::<Vec<u8>>()
        );
        assert!(root.is_sampled());

        // An all-zero trace id, then an all-zero span id, are drawn again.
        let zero_trace = [0u8; 16].into_iter().chain([9; 8]);
        let zero_span = [7u8; 16].into_iter().chain([0; 8]);
        let good = [5u8; 24];
        let mut rng = Scripted::new(zero_trace.chain(zero_span).chain(good));
        let root = TraceContext::root_from(&mut rng);
        assert_eq!(rng.draws, 3);
        assert_eq!(root.trace_id_bytes(), [5; 16]);
        assert_eq!(root.span_id_bytes(), [5; 8]);

        // A child's span id is neither all zero nor its parent's.
        let mut rng = Scripted::new([0u8; 8].into_iter().chain([5; 8]).chain([6; 8]));
        let child = root.child_from(&mut rng);
        assert_eq!(rng.draws, 3);
        assert_eq!(child.span_id_bytes(), [6; 8]);
        assert_eq!(child.trace_id_bytes(), root.trace_id_bytes());
    }

    #[test]
    fn json_holds_the_two_headers() {
        let context = TraceContext::parse(VALID, Some("a=b")).unwrap();
        let json = serde_json::to_value(&context).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"traceparent": VALID, "tracestate": "a=b"})
        );
        let back: TraceContext = serde_json::from_value(json).unwrap();
        assert_eq!(back, context);
        let bad = serde_json::json!({"traceparent": "01-xyz"});
        assert!(serde_json::from_value::<TraceContext>(bad).is_err());
    }
}
