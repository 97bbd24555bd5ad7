//! The cheap token estimator: one branch-free pass over the bytes, a weight per byte from
//! the classes of the byte and of the two bytes before it, including a rule for
//! base64-like runs.
//!
//! # The formula
//!
//! Each byte is classified by comparisons: lowercase, uppercase, digit, space, ASCII
//! punctuation (DEL included), UTF-8 lead byte (`0xc0..`), and the rest (continuation
//! bytes, newlines, tabs, control bytes). The estimate is `max(1, ceil(W / 128))` for
//! non-empty text (0 for empty), where `W = Σ w(i)` and the weight of byte `i` is a sum
//! of non-negative terms, 128 per token (the constants are in the modules `own_weight`,
//! `pair_weight` and `triple_weight`):
//!
//! - `C(x[i])`, by the byte's own class: a floor of 8 for every byte (no run is free),
//!   plus 29 for an uppercase letter, 65 for a digit, 30 for punctuation, 77 for a UTF-8
//!   lead byte (one per non-ASCII character: CJK is about 0.7 token a character);
//! - for `i >= 1`, `P(x[i-1], x[i])`, the token starts seen from the byte before: a digit
//!   after a non-digit (79), a space after a non-space (100: the space starts the next
//!   word's token, which is why letters after a space cost nothing more), punctuation
//!   after neither punctuation nor a space (46) or after punctuation (11), and the
//!   **base64 rule**, a *transition*: a letter or digit after a letter or digit of
//!   another class among lowercase, uppercase and digit (78). English has about one per
//!   capitalized word; ids, hashes and base64 have one at two pairs in three, and
//!   o200k_base cuts them every two or three characters. The rule is a pair of bytes,
//!   so it needs no state carried along a run;
//! - for `i >= 2`, `T(x[i-2], x[i-1], x[i])`: an ASCII byte other than a space after two
//!   spaces (42), the end of an indentation run, whose last space goes with the next
//!   token.
//!
//! The weights were fitted by coordinate descent over non-negative integers (the sum of a
//! byte's terms at most 255) to o200k_base token counts, each content type weighted
//! equally: the corpus of `tests/accuracy.rs` (JSON tool results, prose, Rust, Chinese,
//! Japanese, base64) and, so the fit does not only learn that corpus, this workspace's
//! Markdown, the other crates' Rust and the catalogues as compact JSON. The measured table
//! is in that test's output. Earlier versions had an 18-class pair table and a run state
//! for base64 (3.1% mean error); this one trades a little accuracy (about 2% mean error,
//! 5% at worst on prose) for a formula without table lookups or state, three times as
//! fast.
//!
//! # Why it is monotone under concatenation
//!
//! `ceil(x / 128)` and `max(1, ·)` are non-decreasing, so it suffices that
//! `W(a ++ b) >= W(a)` and `W(a ++ b) >= W(b)`. Every term `C`, `P`, `T` is non-negative,
//! and the terms of a byte fit in its `u8` lane without overflow (both checked,
//! exhaustively, by `weights_are_non_negative_and_fit_a_lane`), so `w(i)` is the plain
//! sum.
//!
//! - `W(a ++ b) >= W(a)`: a byte's terms read only that byte and the two before it, so
//!   `a`'s bytes weigh the same in `a ++ b`, and `b`'s bytes add weights that are never
//!   negative.
//! - `W(a ++ b) >= W(b)`: take byte `b[j]`, at position `|a| + j` in `a ++ b`. Its `C`
//!   term is the same. Its `P` term is in `W(b)` only when `j >= 1`, and then reads the
//!   same two bytes in both; when `j = 0` it is absent from `W(b)` and `>= 0` in
//!   `W(a ++ b)`. Likewise `T`, present in `W(b)` only when `j >= 2`, then with the same
//!   three bytes. So every byte of `b` weighs at least as much in `a ++ b`, and `a`'s bytes
//!   add more.
//!
//! A term that would read before the start of the text is simply absent: it is the least
//! it could be, whatever text is later put in front. No table property is needed beyond
//! non-negative weights. Unit tests check that the fast evaluation equals the formula
//! written plainly, and `W` itself on random byte strings; the crate's proptests check
//! the estimate on adversarial strings (base64 runs split at every point, space runs,
//! CJK, combining marks).
//!
//! # Why it is fast
//!
//! The bytes are read in 64-byte blocks, three times over with offsets 0, 1 and 2 (so
//! the block, the byte before each and the byte two before each are lanes of three
//! arrays; nothing is carried between blocks). Classification is range comparisons,
//! terms are `mask & constant`, and weights add up in `u16` lanes, emptied into a `u64`
//! every 256 blocks: LLVM turns the block loop into SSE2 vector code without `unsafe`
//! (16 bytes an instruction). Bytes the blocks do not cover (the first two, the tail)
//! take the same formula one at a time.

use psych_types::TokenEstimator;

/// Weight units per estimated token.
const UNIT: u64 = 128;

/// Estimated tokens per base64 character of binary content, in 1/256ths: o200k_base cuts
/// random base64 into 19,238 tokens per 28,144 characters (0.684) on the accuracy corpus.
const BASE64_WEIGHT: u64 = 175;
/// Units of [`BASE64_WEIGHT`].
const BASE64_UNIT: u64 = 256;

/// Weights of `C`, by the byte's own class.
mod own_weight {
    /// Every byte, whatever its class: no run, however long, is free.
    pub(super) const FLOOR: u8 = 8;
    /// An uppercase letter.
    pub(super) const UPPER: u8 = 29;
    /// A digit.
    pub(super) const DIGIT: u8 = 65;
    /// ASCII punctuation.
    pub(super) const PUNCT: u8 = 30;
    /// A UTF-8 lead byte (`0xc0..=0xff`): one per non-ASCII character.
    pub(super) const LEAD: u8 = 77;
}

/// Weights of `P`, by the byte and the one before it.
mod pair_weight {
    /// A digit after a non-digit.
    pub(super) const DIGIT_START: u8 = 79;
    /// A space after a non-space.
    pub(super) const SPACE_START: u8 = 100;
    /// Punctuation after neither punctuation nor a space.
    pub(super) const PUNCT_START: u8 = 46;
    /// Punctuation after punctuation.
    pub(super) const PUNCT_PUNCT: u8 = 11;
    /// A letter or digit after a letter or digit of another class (lowercase, uppercase,
    /// digit): the base64 rule.
    pub(super) const TRANSITION: u8 = 78;
}

/// Weights of `T`, by the byte and the two before it.
mod triple_weight {
    /// An ASCII byte other than a space after two spaces.
    pub(super) const AFTER_INDENT: u8 = 42;
}

/// The workspace's cheap token estimator.
///
/// A trigger for thresholds, not a meter: it is fast (one branch-free pass that the
/// compiler vectorizes; see the crate's benchmark), monotone (appending or prepending
/// text never lowers the estimate), and within a few percent of o200k_base on the content
/// types tool results carry (see `tests/accuracy.rs` for the measured table). **Never use
/// it for cost**: cost comes from provider-reported usage, and no estimate may stand in
/// for a billed number.
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
        let tokens = (chars * u128::from(BASE64_WEIGHT)).div_ceil(u128::from(BASE64_UNIT));
        u64::try_from(tokens).unwrap_or(u64::MAX)
    }
}

// The classes of a byte, by range comparisons only (`x - lo < n` unsigned, `x as i8 > k`
// signed), which compile to a few SSE2 instructions for 16 bytes at once. They are plain
// functions of one byte (not a struct of flags: LLVM packs a struct of eight `bool`s
// into a `u64` and then vectorizes the packing instead of the comparisons), and once
// inlined the compiler computes each only once per byte.

/// `a`–`z` or `A`–`Z`.
#[inline(always)]
fn is_letter(x: u8) -> bool {
    (x | 0x20).wrapping_sub(b'a') < 26
}

/// `A`–`Z`.
#[inline(always)]
fn is_upper(x: u8) -> bool {
    is_letter(x) & (x & 0x20 == 0)
}

/// `0`–`9`.
#[inline(always)]
fn is_digit(x: u8) -> bool {
    x.wrapping_sub(b'0') < 10
}

/// A letter or a digit.
#[inline(always)]
fn is_alnum(x: u8) -> bool {
    is_letter(x) | is_digit(x)
}

/// A space.
#[inline(always)]
fn is_space(x: u8) -> bool {
    x == b' '
}

/// ASCII punctuation: `0x21..=0x7f` but letters and digits (DEL counts).
#[inline(always)]
fn is_punct(x: u8) -> bool {
    (x.cast_signed() > 0x20) & !is_alnum(x)
}

/// A UTF-8 lead byte, `0xc0..=0xff` (as `i8`, `-64..=-1`).
#[inline(always)]
fn is_lead(x: u8) -> bool {
    (x.cast_signed() >= -64) & (x.cast_signed() < 0)
}

/// An ASCII byte other than a space.
#[inline(always)]
fn is_ascii_non_space(x: u8) -> bool {
    (x.cast_signed() >= 0) & !is_space(x)
}

/// `weight` if `on`, else 0.
#[inline(always)]
fn when(on: bool, weight: u8) -> u8 {
    u8::from(on).wrapping_neg() & weight
}

/// `C`: the byte's own weight. The classes are disjoint, so `|` adds.
#[inline(always)]
fn own(c: u8) -> u8 {
    own_weight::FLOOR
        + (when(is_upper(c), own_weight::UPPER)
            | when(is_digit(c), own_weight::DIGIT)
            | when(is_punct(c), own_weight::PUNCT)
            | when(is_lead(c), own_weight::LEAD))
}

/// `P`: what the byte `c` weighs more after the byte `p`.
#[inline(always)]
fn pair(p: u8, c: u8) -> u8 {
    // The first four are keyed on disjoint classes of `c`, so `|` adds.
    let starts = when(is_digit(c) & !is_digit(p), pair_weight::DIGIT_START)
        | when(is_space(c) & !is_space(p), pair_weight::SPACE_START)
        | when(
            is_punct(c) & !(is_punct(p) | is_space(p)),
            pair_weight::PUNCT_START,
        )
        | when(is_punct(c) & is_punct(p), pair_weight::PUNCT_PUNCT);
    // Lowercase, uppercase and digits differ in bits 5 and 6 (0x60, 0x40, 0x20).
    let transition = is_alnum(c) & is_alnum(p) & ((c ^ p) & 0x60 != 0);
    starts + when(transition, pair_weight::TRANSITION)
}

/// `T`: what the byte `c` weighs more after the bytes `q` and `p`.
#[inline(always)]
fn triple(q: u8, p: u8, c: u8) -> u8 {
    when(
        is_ascii_non_space(c) & is_space(p) & is_space(q),
        triple_weight::AFTER_INDENT,
    )
}

/// The whole weight of a byte `c` after `p` after `q` (all three in the text). At most
/// 255 for every three bytes (checked exhaustively by
/// `weights_are_non_negative_and_fit_a_lane`), so no `u8` addition here overflows.
#[inline(always)]
fn lane(q: u8, p: u8, c: u8) -> u8 {
    own(c) + pair(p, c) + triple(q, p, c)
}

/// The weight of `bytes[i]`, with the terms that would read before the text left out.
fn weight_at(bytes: &[u8], i: usize) -> u64 {
    let Some(&c) = bytes.get(i) else { return 0 };
    let mut w = u64::from(own(c));
    if let Some(&p) = i.checked_sub(1).and_then(|at| bytes.get(at)) {
        w += u64::from(pair(p, c));
        if let Some(&q) = i.checked_sub(2).and_then(|at| bytes.get(at)) {
            w += u64::from(triple(q, p, c));
        }
    }
    w
}

/// Bytes per block.
const BLOCK: usize = 64;
/// Blocks a `u16` lane holds before it is emptied: 256 × 255 < 65,536.
const BLOCKS_PER_FLUSH: usize = 256;

/// Adds the weights of one block's bytes to `acc`: `c` is the block, `p` the same
/// bytes one back, `q` two back. Fixed-size arrays and lane-wise arithmetic only, so it
/// vectorizes; the weights are computed in a loop of their own, so that loop works on 16
/// `u8` lanes a vector rather than the 8 of the `u16` sums.
#[inline(always)]
fn block(q: &[u8; BLOCK], p: &[u8; BLOCK], c: &[u8; BLOCK], acc: &mut [u16; BLOCK]) {
    let mut w = [0u8; BLOCK];
    for j in 0..BLOCK {
        w[j] = lane(q[j], p[j], c[j]);
    }
    for j in 0..BLOCK {
        acc[j] += u16::from(w[j]);
    }
}

/// The sum of the weights of `bytes`, [`UNIT`] per estimated token.
fn weight(bytes: &[u8]) -> u64 {
    // Bytes 0 and 1 lack a full window; blocks start at byte 2.
    let head = bytes.len().min(2);
    let mut sum: u64 = (0..head).map(|i| weight_at(bytes, i)).sum();
    let body = bytes.get(2..).unwrap_or_default();
    let (blocks, _) = body.as_chunks::<BLOCK>();
    let (ones_back, _) = bytes.get(1..).unwrap_or_default().as_chunks::<BLOCK>();
    let (twos_back, _) = bytes.as_chunks::<BLOCK>();
    // The three views have the same blocks at the same indices (`ones_back` and
    // `twos_back` may have one more); zip stops with `blocks`.
    let groups = blocks
        .chunks(BLOCKS_PER_FLUSH)
        .zip(ones_back.chunks(BLOCKS_PER_FLUSH))
        .zip(twos_back.chunks(BLOCKS_PER_FLUSH));
    for ((cs, ps), qs) in groups {
        let mut acc = [0u16; BLOCK];
        for ((c, p), q) in cs.iter().zip(ps).zip(qs) {
            block(q, p, c, &mut acc);
        }
        sum += acc.iter().map(|&lane| u64::from(lane)).sum::<u64>();
    }
    let covered = 2 + BLOCK * blocks.len();
    sum + (covered..bytes.len())
        .map(|i| weight_at(bytes, i))
        .sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn est(text: &str) -> u64 {
        Estimator.estimate_text(text)
    }

    /// The formula as the module docs state it, written plainly.
    fn reference_weight(bytes: &[u8]) -> u64 {
        (0..bytes.len()).map(|i| weight_at(bytes, i)).sum()
    }

    #[test]
    fn weights_are_non_negative_and_fit_a_lane() {
        // `T` reads the byte two back only through `is_space`: a space and a non-space
        // stand for all of them; every pair of the byte before and the byte itself.
        for q in [b' ', b'x'] {
            for p in 0..=255u8 {
                for c in 0..=255u8 {
                    // Terms are u8 (never negative); their sum in u16 must fit a u8 lane.
                    let whole =
                        u16::from(own(c)) + u16::from(pair(p, c)) + u16::from(triple(q, p, c));
                    assert!(whole <= 255, "overflow at {q:#x} {p:#x} {c:#x}");
                    assert_eq!(u16::from(lane(q, p, c)), whole);
                }
            }
        }
    }

    #[test]
    fn classes_are_disjoint_and_cover_every_byte() {
        for x in 0..=255u8 {
            let lower = is_letter(x) & !is_upper(x);
            let cont = (0x80..0xc0).contains(&x);
            let control = is_ascii_non_space(x) & !is_alnum(x) & !is_punct(x);
            let flags = [
                lower,
                is_upper(x),
                is_digit(x),
                is_space(x),
                is_punct(x),
                is_lead(x),
                cont,
                control,
            ];
            assert_eq!(flags.iter().filter(|&&f| f).count(), 1, "{x:#x}");
            assert_eq!(lower, x.is_ascii_lowercase(), "{x:#x}");
            assert_eq!(is_upper(x), x.is_ascii_uppercase(), "{x:#x}");
            assert_eq!(is_digit(x), x.is_ascii_digit(), "{x:#x}");
            assert_eq!(is_alnum(x), x.is_ascii_alphanumeric(), "{x:#x}");
            assert_eq!(is_punct(x), x.is_ascii_punctuation() || x == 0x7f, "{x:#x}");
            assert_eq!(is_lead(x), x >= 0xc0, "{x:#x}");
            assert_eq!(control, x.is_ascii_control() && x != 0x7f, "{x:#x}");
        }
    }

    #[test]
    fn fast_loop_matches_the_plain_formula_across_flushes() {
        // Past 256 blocks (16 KiB), so the u16 lanes are emptied at least once, with an
        // odd tail; every kind of byte.
        let bytes: Vec<u8> = (0..40_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        assert_eq!(weight(&bytes), reference_weight(&bytes));
        let text =
            "ZGF0YTppbWFnZS9wbmc7YmFzZTY0 {\"id\": 12345, \"name\": \"中文\"}\n    x".repeat(700);
        assert_eq!(weight(text.as_bytes()), reference_weight(text.as_bytes()));
        // The largest lane weight on every byte still sums exactly.
        let worst = [0xe4u8, 0x01].repeat(20_000);
        assert_eq!(weight(&worst), reference_weight(&worst));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

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

        #[test]
        fn weight_is_monotone_under_concatenation_of_raw_bytes(
            a in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..140),
            b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..140),
        ) {
            // The inequalities of the proof, on the weight itself (no rounding to hide in).
            let ab = [a.as_slice(), b.as_slice()].concat();
            proptest::prop_assert!(weight(&ab) >= weight(&a));
            proptest::prop_assert!(weight(&ab) >= weight(&b));
        }
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
        // Indentation runs cost far less than a token a space: only the floor of 1/16
        // token a byte (36 more spaces, 2.25 tokens) and the run's end.
        let shallow = format!("{{\n{}\"a\": 1\n}}", " ".repeat(4));
        let deep = format!("{{\n{}\"a\": 1\n}}", " ".repeat(40));
        assert!(
            est(&deep) <= est(&shallow) + 3,
            "{} vs {}",
            est(&deep),
            est(&shallow)
        );
        // A long run of one letter is not free either.
        assert!(est(&"x".repeat(10_000)) >= 500);
        // Nor is any run of one byte: every byte costs at least 1/16 token, so a result of
        // 100,000 newlines, spaces or rule characters still trips a threshold (o200k counts
        // 6,250 tokens for the newlines, 782 for the spaces, 1,562 for the dashes).
        for byte in ["\n", " ", "-", ".", "/", "="] {
            let run = byte.repeat(100_000);
            assert!(est(&run) >= 100_000 / 16, "{byte:?}: {}", est(&run));
        }
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
