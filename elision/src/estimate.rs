//! The cheap token estimator: one pass over the bytes, a weight per pair of byte classes,
//! and a rule for base64-like runs.
//!
//! # The formula
//!
//! Every byte gets a class (space, newline, lowercase, uppercase, digit, quote, JSON
//! punctuation, `-`/`_`, `.`/`/`, `+`/`=`, other punctuation, UTF-8 lead and continuation
//! bytes, and "a space after a space"). The estimate is `ceil(Σ w / 256)` where `w` is a
//! weight looked up by `(mode, class of the previous byte, class of this byte)`. A weight is
//! 256 × the probability that a token of o200k_base starts at such a byte, measured on the
//! corpus of `tests/accuracy.rs` (JSON tool results, prose, Rust, Chinese, Japanese, base64),
//! each content type weighted equally. The start of an indentation run's last space is
//! counted on the byte after the run, where a one-pass reader can see it.
//!
//! `mode` is the base64 rule. Inside a run of letters and digits, a change between
//! lowercase, uppercase and digit is a *transition*; once a run has had two, it is
//! base64-like (ids, hashes, node ids, data URIs), and tokenizers cut such runs into
//! pieces of two or three characters instead of whole words. Mode 1 weights are those
//! measured in such runs. Any byte that is not a letter or digit ends the run. Two
//! transitions measured best (mean error with one: 5.7%, two: 3.4%, three: 3.7%, four: 3.4%
//! but a worse worst type, 7.8% against 6.3%; with no rule at all: 8.2%, prose off by 21%).
//!
//! # Why it is monotone under concatenation
//!
//! Let `e(s) = ceil(W(s) / 256)` with `W(s)` the sum of the weights of `s`'s bytes. Since
//! `ceil(x / 256)` is non-decreasing in `x`, it suffices that `W(a ++ b) >= W(a)` and
//! `W(a ++ b) >= W(b)`.
//!
//! - `W(a ++ b) >= W(a)`: a byte's weight depends only on the bytes before it, so `a`'s
//!   bytes weigh the same in `a ++ b`, and `b`'s bytes add weights that are never negative.
//! - `W(a ++ b) >= W(b)`: compare each byte of `b` in `a ++ b` with the same byte in `b`
//!   alone. A byte's class depends on the byte and, for a space, on whether the byte before
//!   it is a space, so from `b[1]` on the classes are the same in both, and so are the
//!   previous classes from `b[2]` on. The mode can only be higher in `a ++ b`: the current
//!   run there is `b`'s with `a`'s tail (and perhaps one boundary transition) in front, so
//!   it has at least as many transitions, and from `b`'s first non-run byte on both are
//!   reset alike. Four properties of the table, checked by a unit test, finish it:
//!   (D) every mode 1 weight is >= the mode 0 weight of the same pair, so a higher mode
//!   never weighs less; (A) the start row holds the column minimum of every row of both
//!   modes, so `b[0]` weighs no less after any byte of `a` when its class is unchanged;
//!   (B) when `b[0]` is a space that `a`'s trailing space promotes to "space after space",
//!   its new weight (space or space-after-space row, that column) is >= the start row's
//!   space weight; (C) then `b[1]` is read after "space after space" instead of "space",
//!   and that row is >= the space row column by column. So every byte of `b` weighs at
//!   least as much in `a ++ b`, and `a`'s bytes add more.
//!
//! Non-empty text is estimated at least 1 token (`max(1, …)` keeps both inequalities), and
//! empty text 0.
//!
//! The unit tests check these table properties (`table_supports_the_monotonicity_proof`),
//! and proptests check the conclusion on adversarial strings: base64 runs split at every
//! point, space runs, CJK, combining marks.

use psych_types::TokenEstimator;

/// Number of byte classes, including the start class.
const CLASSES: usize = 18;

/// Before the first byte.
const START: u8 = 0;
/// A space (0x20).
const SPACE: u8 = 1;
/// `\n` or `\r`.
const NEWLINE: u8 = 2;
/// Other ASCII control bytes, tab included.
const CONTROL: u8 = 3;
/// `a`–`z`.
const LOWER: u8 = 4;
/// `A`–`Z`.
const UPPER: u8 = 5;
/// `0`–`9`.
const DIGIT: u8 = 6;
/// `"`.
const QUOTE: u8 = 7;
/// `:` `,` `{` `}` `[` `]`.
const JSON_PUNCT: u8 = 8;
/// `-` `_`.
const DASH: u8 = 9;
/// `.` `/`.
const DOT_SLASH: u8 = 10;
/// `+` `=`.
const PLUS_EQ: u8 = 11;
/// Any other printable ASCII punctuation.
const PUNCT: u8 = 12;
/// UTF-8 continuation byte.
const CONT: u8 = 13;
/// Lead byte of a two-byte UTF-8 sequence.
const LEAD2: u8 = 14;
/// Lead byte of a three-byte UTF-8 sequence (most CJK).
const LEAD3: u8 = 15;
/// Lead byte of a four-byte UTF-8 sequence (emoji, rare CJK).
const LEAD4: u8 = 16;
/// A space right after a space (indentation, alignment).
const SPACE2: u8 = 17;

const fn class_of(byte: u8) -> u8 {
    match byte {
        b' ' => SPACE,
        b'\n' | b'\r' => NEWLINE,
        0..=0x1f | 0x7f => CONTROL,
        b'a'..=b'z' => LOWER,
        b'A'..=b'Z' => UPPER,
        b'0'..=b'9' => DIGIT,
        b'"' => QUOTE,
        b':' | b',' | b'{' | b'}' | b'[' | b']' => JSON_PUNCT,
        b'-' | b'_' => DASH,
        b'.' | b'/' => DOT_SLASH,
        b'+' | b'=' => PLUS_EQ,
        0x21..=0x7e => PUNCT,
        0x80..=0xbf => CONT,
        0xc0..=0xdf => LEAD2,
        0xe0..=0xef => LEAD3,
        _ => LEAD4,
    }
}

#[cfg(test)]
const fn class_table() -> [u8; 256] {
    let mut table = [0u8; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = class_of(byte as u8);
        byte += 1;
    }
    table
}

/// The class of every byte.
#[cfg(test)]
static CLASS: [u8; 256] = class_table();

/// Whether a class is a letter or digit, the bytes of a (possibly base64-like) run.
const fn is_run(class: u8) -> bool {
    matches!(class, LOWER | UPPER | DIGIT)
}

/// Weights, 256 per token, by `[mode][previous class][class]`. Measured on the accuracy
/// corpus (see the module docs); pairs never seen there weigh 64 (`bytes / 4`). Then, for
/// the monotonicity proof: mode 1 raised to at least mode 0, the start row lowered to the
/// column minimum of every row, and the space-after-space row and column raised to at
/// least the space row and column.
#[rustfmt::skip]
static WEIGHTS: [[[u16; CLASSES]; CLASSES]; 2] = [
    // mode 0: ordinary text
    [
        [ 64,   0,   0,  64,   0,   0,  52,   0,   0,   0,   0,   0,   0,   0,   0,   0,  64,   0],
        [ 64,  64,   0,  64,   0,   0, 256,   0,   0,   0,   0,   0,   0,  64,   0,   0,  64,   0],
        [ 64, 256,   0,  64, 256, 256, 256,  64, 256, 256,  82,  64, 256,  64,  64, 256,  64,  64],
        [ 64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64],
        [ 64, 256, 256,  64,   5, 256, 256, 256, 256, 256, 256, 256, 254,  64, 256,  64,  64,  64],
        [ 64, 256, 256,  64,  44,  76, 256, 256, 256, 256, 256, 256, 256,  64,  64,  64,  64,  64],
        [ 64, 256, 256,  64, 256, 256,  52, 256, 256, 256, 256, 256, 256,  64,  64,  64,  64,  64],
        [ 64, 256,   0,  64, 256, 256, 256, 109,   0,   0,  34,  16,  18,  64,  64, 256,  64,  64],
        [ 64, 256,   0,  64, 210, 252, 256,  10,   3,   0,   2,   0,  43,  64,  64,  64,  64,  64],
        [ 64, 256,  64,  64,  11,   5, 256, 256, 125,   0,  97, 256,  24,  64,  64, 256,  64,  64],
        [ 64, 256,   0,  64,  73,  66, 256,  41,  72, 256,   0,  54,  86,  64,  64,  64,  64,  64],
        [ 64, 256,  64,  64, 164, 234, 256, 123,   0,  64,   6,   3,  13,  64,  64,  64,  64,  64],
        [ 64, 256,   2,  64, 181, 144, 256,  17,  17, 115,  25,  50,  16,  64,  64,  64,  64,  64],
        [ 64, 256,  24,  64,  69,  64, 256, 128,  64,  64,  64,  64, 256,   3, 256, 200,  64,  64],
        [ 64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,   0,  64,  64,  64,  64],
        [ 64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,   0,  64,  64,  64,  64],
        [ 64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64],
        [ 64,  64,  64,  64, 256, 256, 256, 256, 256, 256, 256,  64, 256,  64,  64,  64,  64,   0],
    ],
    // mode 1: inside a base64-like run
    [
        [ 64,   0,   0,  64,   0,   0,  52,   0,   0,   0,   0,   0,   0,   0,   0,   0,  64,   0],
        [ 64,  64,   0,  64,   0,   0, 256,   0,   0,   0,   0,   0,   0,  64,   0,   0,  64,   0],
        [ 64, 256,   0,  64, 256, 256, 256,  64, 256, 256,  82,  64, 256,  64,  64, 256,  64,  64],
        [ 64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64],
        [ 64, 256, 256,  64,  68, 256, 256, 256, 256, 256, 256, 256, 254,  64, 256,  64,  64,  64],
        [ 64, 256, 256,  64, 143, 102, 256, 256, 256, 256, 256, 256, 256,  64,  64,  64,  64,  64],
        [ 64, 256, 256,  64, 256, 256,  52, 256, 256, 256, 256, 256, 256,  64,  64,  64,  64,  64],
        [ 64, 256,   0,  64, 256, 256, 256, 109,   0,   0,  34,  16,  18,  64,  64, 256,  64,  64],
        [ 64, 256,   0,  64, 210, 252, 256,  10,   3,   0,   2,   0,  43,  64,  64,  64,  64,  64],
        [ 64, 256,  64,  64,  11,   5, 256, 256, 125,   0,  97, 256,  24,  64,  64, 256,  64,  64],
        [ 64, 256,   0,  64,  73,  66, 256,  41,  72, 256,   0,  54,  86,  64,  64,  64,  64,  64],
        [ 64, 256,  64,  64, 164, 234, 256, 123,   0,  64,   6,   3,  13,  64,  64,  64,  64,  64],
        [ 64, 256,   2,  64, 181, 144, 256,  17,  17, 115,  25,  50,  16,  64,  64,  64,  64,  64],
        [ 64, 256,  24,  64,  69,  64, 256, 128,  64,  64,  64,  64, 256,   3, 256, 200,  64,  64],
        [ 64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,   0,  64,  64,  64,  64],
        [ 64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,   0,  64,  64,  64,  64],
        [ 64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64,  64],
        [ 64,  64,  64,  64, 256, 256, 256, 256, 256, 256, 256,  64, 256,  64,  64,  64,  64,   0],
    ],
];

/// Weight units per estimated token.
const UNIT: u64 = 256;

/// Estimated tokens per base64 character, in 1/256ths: o200k_base cuts random base64 into
/// 19,238 tokens per 28,144 characters (0.684) on the accuracy corpus.
const BASE64_WEIGHT: u64 = 175;

/// The workspace's cheap token estimator.
///
/// A trigger for thresholds, not a meter: it is fast (one pass in 64-byte blocks, a
/// table lookup a byte plus bit-mask arithmetic; see the crate's benchmark), monotone
/// (appending or prepending text never lowers the estimate), and within a few percent of
/// o200k_base on the content types tool results carry (see `tests/accuracy.rs` for the
/// measured table). **Never use it for cost**: cost comes from
/// provider-reported usage, and no estimate may stand in for a billed number.
///
/// Binary content is estimated as what its base64 text would cost, since that is how it
/// travels in a request when a provider does not render it. Providers that render images
/// charge by pixels (usually far less); the size-based figure is deliberately the
/// conservative one, so a large image from an earlier turn is elided rather than kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Estimator;

impl Estimator {
    /// The estimator.
    pub fn new() -> Self {
        Self
    }

    /// Estimated tokens of UTF-8 (or any) bytes.
    pub fn estimate_bytes(&self, bytes: &[u8]) -> u64 {
        if bytes.is_empty() {
            return 0;
        }
        weight(bytes).div_ceil(UNIT).max(1)
    }
}

impl TokenEstimator for Estimator {
    fn estimate_text(&self, text: &str) -> u64 {
        self.estimate_bytes(text.as_bytes())
    }

    fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
        // Base64 length, then the measured base64 rate; u128 so no size overflows.
        let chars = u128::from(len).div_ceil(3) * 4;
        let tokens = (chars * u128::from(BASE64_WEIGHT)).div_ceil(u128::from(UNIT));
        u64::try_from(tokens).unwrap_or(u64::MAX)
    }
}

// The fast evaluation. The formula above, written plainly, is `reference_weight` in the
// tests, and a proptest checks that this evaluation gives the same sum on every input.
//
// It splits the sum in three parts, each cheap to compute for many bytes at once:
//
// 1. Mode 0 weights of every `(previous byte, byte)` pair, from one 64 Ki-entry table
//    indexed by the two bytes, where a space before a space counts as "space" (the table
//    cannot see two bytes back). One lookup a byte.
// 2. The "space after space" correction: where the two bytes before are spaces, the
//    previous class is really "space after space"; add the difference of the two rows
//    (never negative, property C). Found with a bit mask, a lookup per indentation run.
// 3. The base64 rule: `mode 1 weight - mode 0 weight`, which is non-zero only for pairs of
//    letters and digits, wherever the mode is on. Computed 64 bytes at a time on bit masks:
//    SWAR classification of the bytes, transitions as mask algebra, and "two transitions
//    since the run began" as two segmented prefix-ORs (log-step doubling), then popcounts.

/// Class of the byte itself, then of a space after a space.
const fn pair_classes(prev: u8, byte: u8) -> (usize, usize) {
    let p = class_of(prev);
    let c = class_of(byte);
    let c = if p == SPACE && c == SPACE { SPACE2 } else { c };
    (p as usize, c as usize)
}

/// Part 1: the mode 0 weight of every byte pair (bits 0–8), indexed `previous << 8 |
/// byte`, with two flags that let a block skip parts 2 and 3.
static PAIR_WEIGHTS: [u16; 65536] = pair_weights_table();

/// Flag of a [`PAIR_WEIGHTS`] entry: the byte is a transition inside a run.
const TRANSITION_FLAG: u16 = 1 << 15;
/// Flag of a [`PAIR_WEIGHTS`] entry: the byte and the one before it are spaces.
const SPACE_PAIR_FLAG: u16 = 1 << 14;
/// The weight bits of a [`PAIR_WEIGHTS`] entry.
const WEIGHT_BITS: u16 = 0x1ff;

const fn pair_weights_table() -> [u16; 65536] {
    let mut table = [0u16; 65536];
    let mut i = 0;
    while i < 65536 {
        let (prev, byte) = ((i >> 8) as u8, (i & 255) as u8);
        let (p, c) = pair_classes(prev, byte);
        let (pc, cc) = (class_of(prev), class_of(byte));
        let transition = is_run(pc) && is_run(cc) && pc != cc;
        let spaces = prev == b' ' && byte == b' ';
        table[i] = WEIGHTS[0][p][c]
            | if transition { TRANSITION_FLAG } else { 0 }
            | if spaces { SPACE_PAIR_FLAG } else { 0 };
        i += 1;
    }
    table
}

/// Part 2: what a byte weighs more after two spaces than after one.
static AFTER_SPACES: [u16; 256] = after_spaces_table();

const fn after_spaces_table() -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut byte = 0;
    while byte < 256 {
        let (_, c) = pair_classes(b' ', byte as u8);
        let (s, s2) = (SPACE as usize, SPACE2 as usize);
        // Property C of the table (checked by a unit test) makes this non-negative.
        table[byte] = WEIGHTS[0][s2][c].saturating_sub(WEIGHTS[0][s][c]);
        byte += 1;
    }
    table
}

/// Part 3: `mode 1 - mode 0` for each pair of run classes, `[previous][class]` with
/// 0 = lowercase, 1 = uppercase, 2 = digit.
const MODE_EXTRA: [[u64; 3]; 3] = {
    let run = [LOWER as usize, UPPER as usize, DIGIT as usize];
    let mut extra = [[0u64; 3]; 3];
    let mut p = 0;
    while p < 3 {
        let mut c = 0;
        while c < 3 {
            let (w0, w1) = (WEIGHTS[0][run[p]][run[c]], WEIGHTS[1][run[p]][run[c]]);
            extra[p][c] = w1.saturating_sub(w0) as u64;
            c += 1;
        }
        p += 1;
    }
    extra
};

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// High bit of each byte of `x` set where the byte is in `lo..=hi` (both ASCII).
const fn in_range(x: u64, lo: u8, hi: u8) -> u64 {
    let low7 = x & !HIGH;
    let at_least_lo = low7 + ONES * (0x80 - lo as u64);
    let above_hi = low7 + ONES * (0x7f - hi as u64);
    at_least_lo & !above_hi & !x & HIGH
}

/// High bit of each byte of `x` set where the byte is `byte`.
const fn equals(x: u64, byte: u8) -> u64 {
    let y = x ^ (ONES * byte as u64);
    !(((y & !HIGH) + !HIGH) | y) & HIGH
}

/// The high bits of the 8 bytes of `m` as 8 bits (byte k to bit k).
const fn gather(m: u64) -> u64 {
    (m >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56
}

/// Bit `i` set where some bit `j <= i` of `seed` is set and `run` holds every bit from
/// `j` to `i`; `carry` continues a fill from before bit 0 through `run`'s leading bits.
const fn fill(seed: u64, run: u64, carry: bool) -> u64 {
    let leading = run & !run.wrapping_add(1);
    let mut filled = (seed & run) | (leading & 0u64.wrapping_sub(carry as u64));
    let mut span = run;
    let mut shift = 1;
    while shift < 64 {
        filled |= (filled << shift) & span;
        span &= span << shift;
        shift *= 2;
    }
    filled
}

/// A word of 8 bytes of a block.
fn words(block: &[u8; 64]) -> impl Iterator<Item = (usize, u64)> + '_ {
    // Always 8 bytes: `chunks_exact` of an array.
    block.chunks_exact(8).enumerate().map(|(w, chunk)| {
        (
            8 * w,
            u64::from_le_bytes(chunk.try_into().unwrap_or_default()),
        )
    })
}

/// Lowercase, uppercase and digit masks of a block: bit `k` is byte `k`.
fn run_masks(block: &[u8; 64]) -> (u64, u64, u64) {
    let (mut lower, mut upper, mut digit) = (0, 0, 0);
    for (at, x) in words(block) {
        // Letters fold to lowercase with bit 5; that bit, moved to the high bit, tells
        // lowercase from uppercase.
        let alpha = in_range(x | (ONES * 0x20), b'a', b'z');
        let case = (x << 2) & HIGH;
        lower |= gather(alpha & case) << at;
        upper |= gather(alpha & !case) << at;
        digit |= gather(in_range(x, b'0', b'9')) << at;
    }
    (lower, upper, digit)
}

/// Space mask of a block: bit `k` is byte `k`.
fn space_mask(block: &[u8; 64]) -> u64 {
    words(block).fold(0, |mask, (at, x)| mask | gather(equals(x, b' ')) << at)
}

/// What parts 2 and 3 carry from one 64-byte block to the next.
#[derive(Default)]
struct Carry {
    /// The last byte's class bits (lowercase, uppercase, digit, space), and whether the
    /// byte before it was a space.
    lower: u64,
    upper: u64,
    digit: u64,
    space: u64,
    space_before: u64,
    /// The open run has had at least one / at least two transitions.
    one: bool,
    two: bool,
}

/// Parts 2 and 3 over the first `len` bytes (1 to 64) of a block, zeros after them.
/// `flags` is the OR of the block's [`PAIR_WEIGHTS`] entries: without a transition (and
/// no transition carried in) part 3 is zero, and without two spaces in a row (carried in
/// or not) part 2 is zero, and neither needs the block's masks.
fn block_extra(block: &[u8; 64], len: usize, flags: u16, carry: &mut Carry) -> u64 {
    let len = len.clamp(1, 64);
    let last = len - 1;
    let mut extra = 0u64;

    if flags & TRANSITION_FLAG != 0 || carry.one {
        let (lower, upper, digit) = run_masks(block);
        let run = lower | upper | digit;
        let lower_before = lower << 1 | carry.lower;
        let upper_before = upper << 1 | carry.upper;
        let digit_before = digit << 1 | carry.digit;
        let run_before = lower_before | upper_before | digit_before;
        let same = (lower & lower_before) | (upper & upper_before) | (digit & digit_before);
        let transition = run & run_before & !same;
        let one = fill(transition, run, carry.one);
        let second = transition & (one << 1 | u64::from(carry.one));
        // Most blocks have no run with two transitions: skip that fill then.
        let two = if second == 0 && !carry.two {
            0
        } else {
            fill(second, run, carry.two)
        };
        let before = [lower_before, upper_before, digit_before];
        let now = [lower, upper, digit];
        for (p, &mask_before) in before.iter().enumerate() {
            for (c, &mask_now) in now.iter().enumerate() {
                let weight = MODE_EXTRA[p][c];
                if weight != 0 {
                    extra += weight * u64::from((two & mask_before & mask_now).count_ones());
                }
            }
        }
        carry.one = (one >> last) & 1 == 1;
        carry.two = (two >> last) & 1 == 1;
    } else {
        carry.one = false;
        carry.two = false;
    }
    let end = block[last];
    let end_class = class_of(end);
    carry.lower = u64::from(end_class == LOWER);
    carry.upper = u64::from(end_class == UPPER);
    carry.digit = u64::from(end_class == DIGIT);

    if flags & SPACE_PAIR_FLAG != 0 || (carry.space & carry.space_before) != 0 {
        // Two spaces before: bits of the space mask one and two places back.
        let space = space_mask(block);
        let one_back = space << 1 | carry.space;
        let two_back = space << 2 | carry.space << 1 | carry.space_before;
        let valid = u64::MAX >> (64 - len);
        let mut after_spaces = one_back & two_back & !space & valid;
        while after_spaces != 0 {
            let at = after_spaces.trailing_zeros() as usize;
            extra += u64::from(AFTER_SPACES[usize::from(block[at & 63])]);
            after_spaces &= after_spaces - 1;
        }
    }
    carry.space_before = if last == 0 {
        carry.space
    } else {
        u64::from(block[last - 1] == b' ')
    };
    carry.space = u64::from(end == b' ');
    extra
}

/// Part 1 over the bytes of one block, `prev` being the byte before it.
fn pair_sum(prev: u8, block: &[u8]) -> (u64, u16) {
    let (mut sum, mut flags) = (0u64, 0u16);
    let mut prev = usize::from(prev);
    for &byte in block {
        let byte = usize::from(byte);
        let entry = PAIR_WEIGHTS[(prev << 8 | byte) & 0xffff];
        sum += u64::from(entry & WEIGHT_BITS);
        flags |= entry;
        prev = byte;
    }
    (sum, flags)
}

/// The sum of the weights of `bytes`, 256 per estimated token: block by block, so each
/// block is read from memory once for the three parts.
fn weight(bytes: &[u8]) -> u64 {
    let Some(&first) = bytes.first() else {
        return 0;
    };
    let mut sum = u64::from(WEIGHTS[0][usize::from(START)][usize::from(class_of(first))]);
    let mut carry = Carry::default();
    let mut prev = first;
    // The first block's first byte has no pair; part 1 starts after it.
    let mut pairs_from = 1;
    let mut blocks = bytes.chunks_exact(64);
    for block in &mut blocks {
        // Always 64 bytes: `chunks_exact(64)`.
        let block: &[u8; 64] = block.try_into().unwrap_or(&[0; 64]);
        let (pairs, flags) = pair_sum(prev, block.get(pairs_from..).unwrap_or_default());
        pairs_from = 0;
        prev = block[63];
        sum += pairs + block_extra(block, 64, flags, &mut carry);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let (pairs, flags) = pair_sum(prev, tail.get(pairs_from..).unwrap_or_default());
        let mut last = [0u8; 64];
        last[..tail.len()].copy_from_slice(tail);
        sum += pairs + block_extra(&last, tail.len(), flags, &mut carry);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn est(text: &str) -> u64 {
        Estimator.estimate_text(text)
    }

    #[test]
    #[allow(clippy::needless_range_loop, reason = "indices name table cells")]
    fn table_supports_the_monotonicity_proof() {
        let (start, space, space2) = (usize::from(START), usize::from(SPACE), usize::from(SPACE2));
        for mode in 0..2 {
            for p in 0..CLASSES {
                for c in 0..CLASSES {
                    // (D) a higher mode never weighs less.
                    assert!(WEIGHTS[1][p][c] >= WEIGHTS[0][p][c], "D at {p},{c}");
                    // (A) the start row is the column minimum of every row of both modes.
                    assert!(
                        WEIGHTS[0][start][c] <= WEIGHTS[mode][p][c],
                        "A at {mode},{p},{c}"
                    );
                    assert_eq!(WEIGHTS[0][start][c], WEIGHTS[1][start][c], "A at {c}");
                }
            }
            for p in [space, space2] {
                // (B) a promoted first space weighs no less than at the start.
                assert!(
                    WEIGHTS[mode][p][space2] >= WEIGHTS[0][start][space],
                    "B at {mode},{p}"
                );
            }
            for c in 0..CLASSES {
                // (C) after "space after space" no byte weighs less than after "space".
                assert!(
                    WEIGHTS[mode][space2][c] >= WEIGHTS[mode][space][c],
                    "C at {mode},{c}"
                );
            }
        }
    }

    /// The formula as the module docs state it, written plainly.
    fn reference_weight(bytes: &[u8]) -> u64 {
        let (mut prev, mut transitions, mut sum) = (START, 0u32, 0u64);
        for &byte in bytes {
            let mut class = CLASS[usize::from(byte)];
            if class == SPACE && (prev == SPACE || prev == SPACE2) {
                class = SPACE2;
            }
            if !is_run(class) {
                transitions = 0;
            } else if is_run(prev) && prev != class {
                transitions += 1;
            }
            let mode = usize::from(transitions >= 2);
            sum += u64::from(WEIGHTS[mode][usize::from(prev)][usize::from(class)]);
            prev = class;
        }
        sum
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3_000))]

        #[test]
        fn fast_loop_matches_the_plain_formula(
            bytes in proptest::collection::vec(
                proptest::sample::select(b"aZ09+/= \n\"{:-._\x80\xe4\xf0\x01".to_vec()),
                0..300,
            ),
            text in ".{0,200}",
            runs in proptest::collection::vec(
                (proptest::sample::select(b"aaZZ09 +".to_vec()), 1usize..90),
                0..12,
            ),
        ) {
            // Long runs across 64-byte block boundaries: base64-like, lowercase, spaces.
            let runs: Vec<u8> =
                runs.into_iter().flat_map(|(b, n)| std::iter::repeat_n(b, n)).collect();
            let mixed: Vec<u8> =
                runs.iter().zip(bytes.iter().cycle()).flat_map(|(&a, &b)| [a, b]).collect();
            proptest::prop_assert_eq!(weight(&runs), reference_weight(&runs));
            proptest::prop_assert_eq!(weight(&mixed), reference_weight(&mixed));
            proptest::prop_assert_eq!(weight(&bytes), reference_weight(&bytes));
            proptest::prop_assert_eq!(weight(text.as_bytes()), reference_weight(text.as_bytes()));
        }
    }

    #[test]
    fn classes_cover_every_byte() {
        assert!(
            CLASS
                .iter()
                .all(|&c| usize::from(c) < CLASSES && c != START)
        );
        assert_eq!(CLASS[usize::from(b' ')], SPACE);
        assert_eq!(CLASS[0xe4], LEAD3);
        assert_eq!(CLASS[0x80], CONT);
    }

    #[test]
    fn small_cases_are_sensible() {
        assert_eq!(est(""), 0);
        assert_eq!(est("a"), 1, "any non-empty word is at least one token");
        assert!(est("hello world") <= 3);
        // Base64 costs far more per byte than English.
        let english = "the quick brown fox jumps over the lazy dog and runs away";
        let b64 = "MDU6SXNzdWUxMjM0NTY3ODk5ZGZhc2RmYXNkZmFzZGZhc2Rm+/9KLmNv";
        assert!(
            est(b64) > 2 * est(english),
            "{} vs {}",
            est(b64),
            est(english)
        );
        // Indentation runs cost about one token however deep.
        let shallow = format!("{{\n{}\"a\": 1\n}}", " ".repeat(4));
        let deep = format!("{{\n{}\"a\": 1\n}}", " ".repeat(40));
        assert!(
            est(&deep) <= est(&shallow) + 1,
            "{} vs {}",
            est(&deep),
            est(&shallow)
        );
    }

    #[test]
    fn binary_is_estimated_as_its_base64() {
        let e = Estimator::new();
        assert_eq!(e.estimate_binary("image/png", 0), 0);
        assert_eq!(e.estimate_binary("image/png", 3), 3); // 4 chars * 0.684 -> 3
        assert_eq!(e.estimate_binary("application/pdf", 3_000), 2_735);
        assert!(
            e.estimate_binary("x", u64::MAX) > u64::MAX / 2,
            "never wraps"
        );
        assert!(e.estimate_binary("a", 1000) <= e.estimate_binary("a", 1001));
    }
}
