//! The cheap token estimator: one pass over the bytes, a weight per byte from
//! the byte and the two bytes before it, with a cost for each script a character is in.
//!
//! # The formula
//!
//! The estimate is `max(1, ceil(W / 128))` for non-empty text (0 for empty), where
//! `W = Σ w(i)`, 128 per token, and the weight of byte `i` is a sum of non-negative
//! terms, each a fitted constant of [`WEIGHTS`] that counts when a condition on the byte
//! and the bytes before it holds (the module `term` names and documents every one):
//!
//! - `C(x[i])`, by the byte's own class: a floor of 8 for every byte (no run is free:
//!   1/16 token a byte at least), more for an uppercase letter, a digit, punctuation;
//! - for `i >= 1`, `P(x[i-1], x[i])`, the token starts seen from the byte before: a
//!   number starting, a space after a non-space (the space starts the next word's token,
//!   which is why letters after it cost nothing more), punctuation after a letter or after
//!   punctuation, a newline, a tab; the **base64 rule**, a *transition*: a letter or digit
//!   after a letter or digit of another class among lowercase, uppercase and digit (ids,
//!   hashes, hex and base64 have one at nearly every pair, and o200k_base cuts them every
//!   two or three characters); and the **script** of a non-ASCII character, on its second
//!   byte: the UTF-8 lead byte before it says which block the character is in (Latin-1,
//!   Latin Extended, Greek, Cyrillic, Armenian, Hebrew, Arabic, Indic scripts, Thai,
//!   Georgian…, symbols, kana, CJK ideographs, Hangul, four-byte characters), and for
//!   leads `0xe0`, `0xe1` and `0xf0` the second byte itself refines it (Devanagari,
//!   Gurmukhi, Oriya, Telugu, Sinhala, Thai, Tibetan; Vietnamese letters; the emoji,
//!   U+1F000..=U+1FFFF, second byte `0x9f`).
//!   Each class has its own weight: with the other terms of its bytes, a character costs
//!   from about 0.3 token (Cyrillic, Devanagari) to 1.5 (Tibetan);
//! - for `i >= 2`, `T(x[i-2], x[i-1], x[i])`: an ASCII byte other than a space after two
//!   spaces, the end of an indentation run, whose last space goes with the next token;
//!   and the third byte of an emoji (`0xf0 0x9f`, then a continuation byte) outside the
//!   blocks of 64 where o200k_base spells most emoji in two tokens ([`POPULAR_THIRDS`]):
//!   in the others (cards, enclosed characters, geometric shapes, arrows, chess, the
//!   newest emoji) nearly every one is three, a weight the second byte's lane cannot
//!   hold alone.
//!
//! # How the weights were fitted
//!
//! `examples/fit_estimator.rs` fits them (`cargo run --release -p psych-elision --example
//! fit_estimator`) by coordinate descent over integers, single and paired moves, to
//! o200k_base token counts: on the corpus built by `tests/corpus/mod.rs` (JSON tool
//! results, prose, Rust, CJK, base64) and on the fitting half of the committed corpus of
//! real text in many scripts and tool-output shapes (`tests/corpus/text/fit`), each
//! content type weighing the same. The held-out half (`tests/corpus/text/held`: other
//! sources of the same types) was never fitted on; `tests/accuracy.rs` asserts the targets
//! on it (mean error over the types at most 8%, none over 25%, none underestimated by
//! more than 15%, 95% of 4 KiB slices within 30%) and prints the table. The two emoji
//! terms (`EMOJI`, `EMOJI_RARE`) came later: fitted alone (`FIT_ONLY`) once the corpus had
//! emoji-heavy types (`emoji-only`, `emoji-heavy-chat`), every other weight kept, so the
//! estimate of every text without an emoji is what it was. Terms that bought
//! too little accuracy for their time were measured with the tool and dropped (a lowercase
//! weight, tab runs, digit runs of three, letters after punctuation or control bytes, a
//! weight per lead byte whatever the script).
//!
//! # Why it is monotone under concatenation
//!
//! `ceil(x / 128)` and `max(1, ·)` are non-decreasing, so it suffices that
//! `W(a ++ b) >= W(a)` and `W(a ++ b) >= W(b)`. Every term `C`, `P`, `T` is non-negative
//! (each is a sum of weights, `u8`, of the conditions that hold), and the terms of a byte
//! fit in its `u8` lane without overflow (checked exhaustively over every window by
//! `weights_are_non_negative_and_fit_a_lane`), so `w(i)` is the plain sum.
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
//! it could be, whatever text is later put in front. A character cut by the end of a text
//! is no exception: its script weight sits on its second byte, so a lone lead byte weighs
//! only its floor until the rest is appended. No table property is needed beyond
//! non-negative weights. Unit tests check that the fast evaluation equals the formula
//! written plainly for every window, and `W` itself on random byte strings; the crate's
//! proptests check the estimate on adversarial strings (base64 runs split at every point,
//! space runs, scripts and emoji split mid-character).
//!
//! The floor makes the run-cost floor: every byte weighs at least 8, so `n` bytes of
//! anything estimate at least `n / 16` tokens (`small_cases_are_sensible`).
//!
//! # Why it is fast
//!
//! The bytes are read in blocks of four vectors, three times over with offsets 0, 1 and 2
//! (so the block, the byte before each and the byte two before each are lanes of three
//! arrays; nothing is carried between blocks). The vectors are as wide as the processor's
//! registers: on an x86 processor with AVX2 (the x86-64-v3 set: AVX2, FMA, BMI1/2 and
//! the rest; a virtual machine that hides one of them gets the narrow loop), 32 lanes in
//! 128-byte blocks, compiled for AVX2 and entered through `fearless_simd`'s runtime
//! detection (safe code on our side:
//! 3.6 GiB/s on the mixed bench input, 1.9 times the narrow loop beside it); elsewhere
//! 16 lanes in 64-byte blocks, compiled for the target's baseline (SSE2 on x86-64). The
//! rest of this section describes the narrow loop; the wide one is the same code at twice
//! the width. The ASCII terms are regrouped by the class of the byte (`ascii_lane`: an
//! uppercase letter or a digit, punctuation, a space, newline or tab; each class tested
//! once, and each weight masked once, punctuation's as the most it can weigh less what
//! the byte before takes off), and every range test is one signed comparison after an
//! addition (`x + k` as `i8` above a bound, so the bound is the comparison's memory
//! operand), which SSE2 has, where an unsigned one costs a `pminub` and a compare. A
//! vector's lanes are summed by a horizontal byte sum (`psadbw`), four to a block: LLVM
//! turns the block into straight SSE2 code without `unsafe` (16 bytes an instruction,
//! about 5.5 instructions a byte on the mixed bench input), the four vectors unrolled,
//! which measured fewer instructions than a loop over them, a narrow block of 32 or 128
//! bytes, or the classes of the byte before kept in memory and read back one lane later (that
//! replaces its comparisons by loads, and stalls on the stores it reads across). The
//! weights and the bytes the classes compare with are read from the model behind
//! `black_box`, not written into the code: as constants, LLVM reloaded each one into a
//! register before each use (see [`weight`]). The floor is added once, by the text's
//! length.
//! Terms that hold at one byte in many (a space, newline or tab after another byte) are
//! one comparison of the byte with the byte before. The script terms are not lanes: in
//! a block where a byte is `0x80` or above, each `u64` of the block gives, in three
//! operations, a bit for every continuation byte after a lead byte, and each such
//! character is one lookup (the lead's and the second byte's low six bits index a 4 KiB
//! table of script classes built at compile time); ASCII pays only the test that skips
//! them (but in the padded last block, below), and text in other scripts pays by the
//! character, not by the byte. The emoji's third bytes are a second pass of the same kind
//! out of line, over the blocks that hold a four-byte lead or follow one (the block's
//! largest byte, one vectorized maximum, tells this and whether the block holds any
//! non-ASCII byte at all): each `u64` with no byte of `0xf0` or above two back is skipped
//! after three shifts and a test, else gives a bit for each `0xf0 0x9f` and continuation
//! byte, and each is one lookup in a 64-entry table. The first two bytes take the same formula one at a time,
//! with the same table; the bytes after the last whole block (or a whole text shorter
//! than a block) are copied into a block of padding, a byte at which no term holds, and
//! weighed as one more block ([`PAD`]).

use psych_types::TokenEstimator;

/// Weight units per estimated token.
pub(crate) const UNIT: u64 = 128;

/// Estimated tokens per base64 character of binary content, in 1/256ths: o200k_base cuts
/// random base64 into 19,238 tokens per 28,144 characters (0.684) on the accuracy corpus.
const BASE64_WEIGHT: u64 = 175;
/// Units of [`BASE64_WEIGHT`].
const BASE64_UNIT: u64 = 256;

/// The terms of a byte's weight, each an index into [`WEIGHTS`]: the formula is
/// `w(i) = Σ_k WEIGHTS[k] × [term k holds at byte i]`, and which terms hold is decided by
/// the byte, the byte before it and the byte two before it (see the module docs). Names
/// are in [`term::NAMES`], for the fitting tool and the tests.
pub(crate) mod term {
    /// Every byte: no run, however long, is free.
    pub(crate) const FLOOR: usize = 0;
    /// An uppercase letter.
    pub(crate) const UPPER: usize = 1;
    /// A digit.
    pub(crate) const DIGIT: usize = 2;
    /// ASCII punctuation.
    pub(crate) const PUNCT: usize = 3;
    /// A digit after neither a letter nor a digit: a number starts.
    pub(crate) const DIGIT_START: usize = 4;
    /// A space after a non-space: the space starts the next word's token.
    pub(crate) const SPACE_START: usize = 5;
    /// Punctuation after neither punctuation nor a space.
    pub(crate) const PUNCT_START: usize = 6;
    /// Punctuation after punctuation.
    pub(crate) const PUNCT_PUNCT: usize = 7;
    /// A letter or digit after a letter or digit of another class among lowercase,
    /// uppercase and digit: the base64 and hex rule.
    pub(crate) const TRANSITION: usize = 8;
    /// A newline after a byte other than a newline.
    pub(crate) const NEWLINE_START: usize = 9;
    /// A tab after a byte other than a tab.
    pub(crate) const TAB_START: usize = 10;
    /// The second byte of a character led by `0xc2..=0xc3`: Latin-1 (é, ü, ß, °, NBSP).
    pub(crate) const LATIN1: usize = 11;
    /// … led by `0xc4..=0xc5`: Latin Extended-A (ł, ś, ř, ş, ő).
    pub(crate) const LATIN_EXT_A: usize = 12;
    /// … led by `0xc6..=0xcb`: Latin Extended-B, IPA, modifiers (ư, ơ, ș, ț).
    pub(crate) const LATIN_EXT_B: usize = 13;
    /// … led by `0xcc..=0xcd`: combining diacritical marks.
    pub(crate) const COMBINING: usize = 14;
    /// … led by `0xce..=0xcf`: Greek.
    pub(crate) const GREEK: usize = 15;
    /// … led by `0xd0..=0xd4`: Cyrillic.
    pub(crate) const CYRILLIC: usize = 16;
    /// … led by `0xd5`: Armenian.
    pub(crate) const ARMENIAN: usize = 17;
    /// … led by `0xd6..=0xd7`: Hebrew.
    pub(crate) const HEBREW: usize = 18;
    /// … led by `0xd8..=0xdf`: Arabic, Syriac, Thaana, N'Ko.
    pub(crate) const ARABIC: usize = 19;
    /// … led by `0xe0`, but for the ranges below: Bengali, Gujarati, Tamil, Kannada,
    /// Malayalam.
    pub(crate) const INDIC: usize = 20;
    /// … led by `0xe0` with a second byte in `0xa4..=0xa5`: Devanagari.
    pub(crate) const DEVANAGARI: usize = 21;
    /// … led by `0xe0` with a second byte in `0xa8..=0xa9` or `0xb6..=0xb7`: Gurmukhi
    /// and Sinhala.
    pub(crate) const GURMUKHI_SINHALA: usize = 22;
    /// … led by `0xe0` with a second byte in `0xac..=0xad`: Oriya.
    pub(crate) const ORIYA: usize = 23;
    /// … led by `0xe0` with a second byte in `0xb0..=0xb1`: Telugu.
    pub(crate) const TELUGU: usize = 24;
    /// … led by `0xe0` with a second byte in `0xb8..=0xbb`: Thai and Lao.
    pub(crate) const THAI_LAO: usize = 25;
    /// … led by `0xe0` with a second byte in `0xbc..=0xbf`: Tibetan.
    pub(crate) const TIBETAN: usize = 26;
    /// … led by `0xe1` with a second byte below `0xb8`: Myanmar, Georgian, Hangul Jamo,
    /// Ethiopic, Khmer, Mongolian.
    pub(crate) const E1: usize = 27;
    /// … led by `0xe1` with a second byte from `0xb8`: Latin Extended Additional
    /// (Vietnamese ạ ế ộ), Greek Extended.
    pub(crate) const LATIN_EXT_ADDITIONAL: usize = 28;
    /// … led by `0xe2`: general punctuation (— “ ” …), arrows, maths, box drawing,
    /// dingbats.
    pub(crate) const SYMBOL: usize = 29;
    /// … led by `0xe3`: CJK punctuation, Hiragana, Katakana.
    pub(crate) const KANA: usize = 30;
    /// … led by `0xe4..=0xe9`: CJK ideographs.
    pub(crate) const HAN: usize = 31;
    /// … led by `0xea..=0xed`: Hangul syllables (and Yi, Vai…).
    pub(crate) const HANGUL: usize = 32;
    /// … led by `0xee..=0xef`: private use, CJK compatibility, fullwidth forms, variation
    /// selectors.
    pub(crate) const FULLWIDTH: usize = 33;
    /// … led by `0xf0..=0xff`, but for the emoji below: four-byte characters (CJK
    /// Extension B, mathematical letters, historic scripts).
    pub(crate) const ASTRAL: usize = 34;
    /// An ASCII byte other than a space after two spaces: the end of an indentation run.
    pub(crate) const AFTER_INDENT: usize = 35;
    /// … led by `0xf0` with a second byte `0x9f`: U+1F000..=U+1FFFF, the emoji (faces,
    /// pictographs, transport, flags' regional indicators, skin tones), playing cards and
    /// enclosed characters. o200k_base spells most of them in two or three tokens, the
    /// few hundred commonest in one.
    pub(crate) const EMOJI: usize = 36;
    /// The third byte of an emoji (after `0xf0 0x9f`) outside the blocks of 64 where
    /// o200k_base spells most in two tokens ([`POPULAR_THIRDS`](super::POPULAR_THIRDS):
    /// regional indicators, pictographs, emoticons, transport, the supplemental faces and
    /// hands): in the others (playing cards, enclosed characters, alchemical and geometric
    /// shapes, arrows, chess, the newest emoji) nearly all are three.
    pub(crate) const EMOJI_RARE: usize = 37;
    /// How many terms there are.
    pub(crate) const COUNT: usize = 38;

    /// The terms' names, by index.
    #[allow(dead_code, reason = "the tests and examples/fit_estimator.rs use it")]
    pub(crate) const NAMES: [&str; COUNT] = [
        "FLOOR",
        "UPPER",
        "DIGIT",
        "PUNCT",
        "DIGIT_START",
        "SPACE_START",
        "PUNCT_START",
        "PUNCT_PUNCT",
        "TRANSITION",
        "NEWLINE_START",
        "TAB_START",
        "LATIN1",
        "LATIN_EXT_A",
        "LATIN_EXT_B",
        "COMBINING",
        "GREEK",
        "CYRILLIC",
        "ARMENIAN",
        "HEBREW",
        "ARABIC",
        "INDIC",
        "DEVANAGARI",
        "GURMUKHI_SINHALA",
        "ORIYA",
        "TELUGU",
        "THAI_LAO",
        "TIBETAN",
        "E1",
        "LATIN_EXT_ADDITIONAL",
        "SYMBOL",
        "KANA",
        "HAN",
        "HANGUL",
        "FULLWIDTH",
        "ASTRAL",
        "AFTER_INDENT",
        "EMOJI",
        "EMOJI_RARE",
    ];
}

/// The weight of each term, 128 per token.
pub(crate) type Weights = [u8; term::COUNT];

/// The fitted weights (see "How the weights were fitted" in the module docs).
pub(crate) const WEIGHTS: Weights = [
    8,   // FLOOR
    15,  // UPPER
    26,  // DIGIT
    9,   // PUNCT
    138, // DIGIT_START
    84,  // SPACE_START
    111, // PUNCT_START
    10,  // PUNCT_PUNCT
    111, // TRANSITION
    71,  // NEWLINE_START
    107, // TAB_START
    155, // LATIN1
    246, // LATIN_EXT_A
    0,   // LATIN_EXT_B
    14,  // COMBINING
    25,  // GREEK
    19,  // CYRILLIC
    24,  // ARMENIAN
    33,  // HEBREW
    22,  // ARABIC
    20,  // INDIC
    16,  // DEVANAGARI
    46,  // GURMUKHI_SINHALA
    115, // ORIYA
    33,  // TELUGU
    29,  // THAI_LAO
    175, // TIBETAN
    36,  // E1
    0,   // LATIN_EXT_ADDITIONAL
    202, // SYMBOL
    66,  // KANA
    91,  // HAN
    53,  // HANGUL
    3,   // FULLWIDTH
    116, // ASTRAL
    83,  // AFTER_INDENT
    157, // EMOJI
    247, // EMOJI_RARE
];

/// The lead bytes at which the script of a character changes, in increasing order, with
/// the term of the characters they lead up to the next one. Every lead below the first
/// (`0xc0`, `0xc1`: never valid UTF-8) has no script term.
const LEAD_STEPS: [(u8, usize); 17] = [
    (0xc2, term::LATIN1),
    (0xc4, term::LATIN_EXT_A),
    (0xc6, term::LATIN_EXT_B),
    (0xcc, term::COMBINING),
    (0xce, term::GREEK),
    (0xd0, term::CYRILLIC),
    (0xd5, term::ARMENIAN),
    (0xd6, term::HEBREW),
    (0xd8, term::ARABIC),
    (0xe0, term::INDIC),
    (0xe1, term::E1),
    (0xe2, term::SYMBOL),
    (0xe3, term::KANA),
    (0xe4, term::HAN),
    (0xea, term::HANGUL),
    (0xee, term::FULLWIDTH),
    (0xf0, term::ASTRAL),
];

/// Within the characters led by `0xe0`: the second bytes at which the script changes, in
/// increasing order, with the term from there to the next one (below the first, the
/// lead's own term, [`term::INDIC`]).
const E0_STEPS: [(u8, usize); 11] = [
    (0xa4, term::DEVANAGARI),
    (0xa6, term::INDIC),
    (0xa8, term::GURMUKHI_SINHALA),
    (0xaa, term::INDIC),
    (0xac, term::ORIYA),
    (0xae, term::INDIC),
    (0xb0, term::TELUGU),
    (0xb2, term::INDIC),
    (0xb6, term::GURMUKHI_SINHALA),
    (0xb8, term::THAI_LAO),
    (0xbc, term::TIBETAN),
];

/// Within the characters led by `0xe1`: likewise (below the first, [`term::E1`]).
const E1_STEPS: [(u8, usize); 1] = [(0xb8, term::LATIN_EXT_ADDITIONAL)];

/// Within the characters led by `0xf0`: likewise (below the first, [`term::ASTRAL`]).
const F0_STEPS: [(u8, usize); 2] = [(0x9f, term::EMOJI), (0xa0, term::ASTRAL)];

/// The steps within the characters led by `lead`, for the leads that have any.
const fn steps_within(lead: u8) -> &'static [(u8, usize)] {
    match lead {
        0xe0 => &E0_STEPS,
        0xe1 => &E1_STEPS,
        0xf0 => &F0_STEPS,
        _ => &[],
    }
}

/// The script term of a character led by `lead` whose second byte is `second`, the plain
/// way: `None` for `0xc0`, `0xc1` and bytes that lead nothing.
#[allow(dead_code, reason = "the tests and examples/fit_estimator.rs use it")]
pub(crate) fn script_term(lead: u8, second: u8) -> Option<usize> {
    let last = |steps: &[(u8, usize)], x: u8| {
        steps
            .iter()
            .rev()
            .find(|&&(from, _)| x >= from)
            .map(|&(_, found)| found)
    };
    let found = last(&LEAD_STEPS, lead)?;
    Some(last(steps_within(lead), second).unwrap_or(found))
}

/// The script class of a character led by `lead` (`0xc0..=0xff`) whose second byte is
/// `second` (`0x80..=0xbf`), as an index into [`Model::script`]: the term of
/// [`script_term`], or [`NO_SCRIPT`] for the leads `0xc0` and `0xc1`. The same steps as
/// [`script_term`], written as a `const fn` so that [`SCRIPT_CLASS`] is built at compile
/// time.
const fn script_class(lead: u8, second: u8) -> u8 {
    let mut class = NO_SCRIPT;
    let mut k = 0;
    while k < LEAD_STEPS.len() {
        if lead >= LEAD_STEPS[k].0 {
            class = LEAD_STEPS[k].1 as u8;
        }
        k += 1;
    }
    let steps = steps_within(lead);
    let mut k = 0;
    while k < steps.len() {
        if second >= steps[k].0 {
            class = steps[k].1 as u8;
        }
        k += 1;
    }
    class
}

/// The emoji's blocks of 64 (U+1F000 + 64 × `third & 0x3f`) that are not
/// [`term::EMOJI_RARE`], one bit each by the low six bits of their third byte: `0x87`
/// (U+1F1C0..: the regional indicators of flags), `0x8c..=0x94` (U+1F300..=U+1F53F:
/// pictographs, animals, food, hands, hearts, objects), `0x98..=0x9a` (U+1F600..=U+1F6BF:
/// emoticons, transport) and `0xa4..=0xa5` (U+1F900..=U+1F97F: supplemental faces and
/// hands). Measured with o200k_base, each character alone: 1.9 to 2.0 tokens a
/// character in these blocks, 2.9 to 3.0 in every other.
pub(crate) const POPULAR_THIRDS: u64 = 1 << 0x07 | 0x1ff << 0x0c | 0b111 << 0x18 | 0b11 << 0x24;

/// Whether `q p c` are an emoji's lead, second byte and third byte: `0xf0 0x9f`, then a
/// continuation byte.
#[inline(always)]
fn is_emoji_third(q: u8, p: u8, c: u8) -> bool {
    (q == 0xf0) & (p == 0x9f) & is_continuation(c)
}

/// The index of [`Model::script`] that weighs 0: no script (the leads `0xc0`, `0xc1`).
const NO_SCRIPT: u8 = term::COUNT as u8;

/// The script class of every character, by the low six bits of its lead byte and of its
/// second byte: `SCRIPT_CLASS[(lead & 0x3f) << 6 | (second & 0x3f)]` (see
/// [`script_class`]). Built at compile time; 4 KiB.
static SCRIPT_CLASS: [u8; 64 * 64] = {
    let mut table = [0u8; 64 * 64];
    let mut i = 0;
    while i < table.len() {
        // `i >> 6` and `i & 63` are below 64, so both casts are exact.
        table[i] = script_class(0xc0 | (i >> 6) as u8, 0x80 | (i & 63) as u8);
        i += 1;
    }
    table
};

/// The index of a character in [`SCRIPT_CLASS`], from its lead byte and its second byte.
#[inline(always)]
fn script_index(lead: u8, second: u8) -> usize {
    usize::from(lead & 0x3f) << 6 | usize::from(second & 0x3f)
}

/// The weights, and the script weights laid out for [`SCRIPT_CLASS`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Model {
    /// The weights.
    pub(crate) w: Weights,
    /// The weight of each script class: `w` and then zeros (the class [`NO_SCRIPT`] is
    /// one of them), 64 entries so that a class masked with `63` needs no bounds check.
    script: [u8; 64],
    /// The weight of an emoji's third byte, by its low six bits: 0 in the blocks of
    /// [`POPULAR_THIRDS`], the weight of [`term::EMOJI_RARE`] in the others.
    emoji_third: [u8; 64],
    /// The class bytes ([`CLASS_BYTES`]), which the block loop reads from here.
    bytes: ClassBytes,
}

impl Model {
    /// The model of the weights `w`.
    pub(crate) const fn new(w: &Weights) -> Self {
        let mut script = [0u8; 64];
        let mut k = 0;
        while k < term::COUNT {
            script[k] = w[k];
            k += 1;
        }
        let mut emoji_third = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            emoji_third[i] = if POPULAR_THIRDS >> i & 1 == 1 {
                0
            } else {
                w[term::EMOJI_RARE]
            };
            i += 1;
        }
        Self {
            w: *w,
            script,
            emoji_third,
            bytes: CLASS_BYTES,
        }
    }

    /// The script weight of a character led by `lead` whose second byte is `second`.
    #[inline(always)]
    fn script_weight(&self, lead: u8, second: u8) -> u8 {
        self.script[usize::from(SCRIPT_CLASS[script_index(lead, second)] & 63)]
    }
}

/// The model of the fitted weights.
const MODEL: Model = Model::new(&WEIGHTS);

/// The workspace's cheap token estimator.
///
/// A trigger for thresholds, not a meter: it is fast (one pass that the compiler
/// vectorizes; see the crate's benchmark), monotone (appending or prepending
/// text never lowers the estimate), and close to o200k_base on the content tool results
/// carry, in every script (see `tests/accuracy.rs` for the measured tables, on content the
/// weights were not fitted to). **Never use it for cost**: cost comes from
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
        let tokens = (chars * u128::from(BASE64_WEIGHT)).div_ceil(u128::from(BASE64_UNIT));
        u64::try_from(tokens).unwrap_or(u64::MAX)
    }
}

// The classes of a byte, by range comparisons only, signed (`x + k` as `i8` above a
// bound, `x as i8 > k`), which compile to two or three SSE2 instructions for 16 bytes at
// once: a `>` against a constant is `pcmpgtb` with the constant as its memory operand,
// where a `<` needs the constant copied into a register first. They are plain functions
// of one byte (not a struct of flags: LLVM packs a struct of eight `bool`s into a `u64`
// and then vectorizes the packing instead of the comparisons), and once inlined the
// compiler computes each only once per byte.

/// The bytes the block loop's class tests compare with ([`ascii_lane`]; the functions
/// below are the same tests with the bytes written in), read from its [`Model`], which
/// it gets through `black_box` (see [`weight`]). `fast_lane_regroups_the_ascii_terms`
/// checks the two forms agree on every window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClassBytes {
    /// A space; also the bit that `| 0x20` sets to lowercase a letter.
    space: u8,
    /// What moves `z` to `i8::MAX`: `x | 0x20` is a letter when, shifted by it, it is above
    /// [`ClassBytes::letters_below`].
    letter_shift: u8,
    /// What moves `Z` to `i8::MAX`.
    upper_shift: u8,
    /// What moves `9` to `i8::MAX`.
    digit_shift: u8,
    /// `i8::MAX - 26` as a byte: a shifted letter is above it.
    letters_below: u8,
    /// `i8::MAX - 10` as a byte: a shifted digit is above it.
    digits_below: u8,
    /// Bits 5 and 6, where lowercase (`0x60`), uppercase (`0x40`) and digits (`0x20`)
    /// differ.
    class_bits: u8,
    /// A newline.
    newline: u8,
    /// A tab.
    tab: u8,
}

/// The class bytes.
const CLASS_BYTES: ClassBytes = ClassBytes {
    space: b' ',
    letter_shift: 0x7f - b'z',
    upper_shift: 0x7f - b'Z',
    digit_shift: 0x7f - b'9',
    letters_below: 0x7f - 26,
    digits_below: 0x7f - 10,
    class_bits: 0x60,
    newline: b'\n',
    tab: b'\t',
};

/// `a`–`z` or `A`–`Z`.
#[inline(always)]
fn is_letter(x: u8) -> bool {
    (x | 0x20).wrapping_add(0x7f - b'z').cast_signed() > i8::MAX - 26
}

/// `A`–`Z`.
#[inline(always)]
fn is_upper(x: u8) -> bool {
    x.wrapping_add(0x7f - b'Z').cast_signed() > i8::MAX - 26
}

/// `0`–`9`.
#[inline(always)]
fn is_digit(x: u8) -> bool {
    x.wrapping_add(0x7f - b'9').cast_signed() > i8::MAX - 10
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

/// A newline.
#[inline(always)]
fn is_newline(x: u8) -> bool {
    x == b'\n'
}

/// A tab.
#[inline(always)]
fn is_tab(x: u8) -> bool {
    x == b'\t'
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

/// A UTF-8 continuation byte, `0x80..=0xbf` (as `i8`, `-128..=-65`).
#[inline(always)]
fn is_continuation(x: u8) -> bool {
    x.cast_signed() < -64
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

/// `C`: the byte's own weight.
#[inline(always)]
fn own(m: &Model, c: u8) -> u8 {
    m.w[term::FLOOR] + own_classes(m, c)
}

/// `C` less the floor, which [`weight_in`] adds once, by the text's length. The classes are disjoint, so
/// `|` adds.
#[inline(always)]
fn own_classes(m: &Model, c: u8) -> u8 {
    when(is_upper(c), m.w[term::UPPER])
        | when(is_digit(c), m.w[term::DIGIT])
        | when(is_punct(c), m.w[term::PUNCT])
}

/// The script weight of `c` after `p`: the weight of the script `p` leads when `p` is a
/// lead byte and `c` a continuation byte, else 0 (one lookup in [`SCRIPT_CLASS`]).
#[inline(always)]
fn script(m: &Model, p: u8, c: u8) -> u8 {
    when(is_lead(p) & is_continuation(c), m.script_weight(p, c))
}

/// `P`: what the byte `c` weighs more after the byte `p`.
#[inline(always)]
fn pair(m: &Model, p: u8, c: u8) -> u8 {
    ascii_pair(m, p, c) + script(m, p, c)
}

/// The terms of `P` but the script's: those of ASCII bytes.
#[inline(always)]
fn ascii_pair(m: &Model, p: u8, c: u8) -> u8 {
    // Keyed on disjoint classes of `c` (space, newline, tab; punctuation; digit), so `|`
    // adds. A space, newline or tab starts a token after any other byte; punctuation
    // weighs one thing after punctuation and another after neither punctuation nor a
    // space.
    let runs = when(is_space(c), m.w[term::SPACE_START])
        | when(is_newline(c), m.w[term::NEWLINE_START])
        | when(is_tab(c), m.w[term::TAB_START]);
    let after_punct = when(is_punct(p), m.w[term::PUNCT_PUNCT])
        | when(!(is_punct(p) | is_space(p)), m.w[term::PUNCT_START]);
    let starts = when(c != p, runs)
        | when(is_punct(c), after_punct)
        | when(is_digit(c) & !is_alnum(p), m.w[term::DIGIT_START]);
    // Lowercase, uppercase and digits differ in bits 5 and 6 (0x60, 0x40, 0x20).
    let transition = is_alnum(c) & is_alnum(p) & ((c ^ p) & 0x60 != 0);
    starts + when(transition, m.w[term::TRANSITION])
}

/// `T`: what the byte `c` weighs more after the bytes `q` and `p`.
#[inline(always)]
fn triple(m: &Model, q: u8, p: u8, c: u8) -> u8 {
    ascii_triple(m, q, p, c) + emoji_third(m, q, p, c)
}

/// The terms of `T` but the emoji's: the end of an indentation run.
#[inline(always)]
fn ascii_triple(m: &Model, q: u8, p: u8, c: u8) -> u8 {
    when(
        is_ascii_non_space(c) & is_space(p) & is_space(q),
        m.w[term::AFTER_INDENT],
    )
}

/// The emoji term of `T`: [`term::EMOJI_RARE`] on the third byte of an emoji outside
/// [`POPULAR_THIRDS`], 0 at any other byte.
#[inline(always)]
fn emoji_third(m: &Model, q: u8, p: u8, c: u8) -> u8 {
    when(is_emoji_third(q, p, c), m.emoji_third[usize::from(c & 63)])
}

/// The whole weight of a byte `c` after `p` after `q` (all three in the text). At most
/// 255 for every three bytes with the fitted weights (checked exhaustively by
/// `weights_are_non_negative_and_fit_a_lane`), so no `u8` addition here overflows.
#[allow(dead_code, reason = "the tests and examples/fit_estimator.rs use it")]
#[inline(always)]
pub(crate) fn lane(m: &Model, q: u8, p: u8, c: u8) -> u8 {
    own(m, c) + pair(m, p, c) + triple(m, q, p, c)
}

/// The weight of `bytes[i]`, with the terms that would read before the text left out.
fn weight_at(m: &Model, bytes: &[u8], i: usize) -> u64 {
    let Some(&c) = bytes.get(i) else { return 0 };
    let mut sum = u64::from(own(m, c));
    if let Some(&p) = i.checked_sub(1).and_then(|at| bytes.get(at)) {
        sum += u64::from(pair(m, p, c));
        if let Some(&q) = i.checked_sub(2).and_then(|at| bytes.get(at)) {
            sum += u64::from(triple(m, q, p, c));
        }
    }
    sum
}

/// Bytes per vector of the narrow loop: the lanes of one SSE2 register (every x86-64
/// has SSE2; on other targets, one NEON or WASM SIMD register).
const NARROW: usize = 16;

/// Bytes per vector of the wide loop, for x86 processors with AVX2: the lanes of one
/// AVX2 register. (Without AVX2 the same loop at this width is slower than the narrow
/// one, each operation split in two SSE2 ones: 1.3 against 1.6 GiB/s.)
#[cfg_attr(
    not(any(target_arch = "x86", target_arch = "x86_64")),
    allow(
        dead_code,
        reason = "only x86 has the wide loop; the tests check it everywhere"
    )
)]
const WIDE: usize = 32;

/// The ASCII terms of a byte `c` after `p` after `q`, but the floor: [`own_classes`] +
/// [`ascii_pair`] + [`triple`], regrouped by the class of `c` so that each class of a byte
/// is tested once and each weight is masked once (`fast_lane_regroups_the_ascii_terms`
/// checks the equality for every window).
#[inline(always)]
fn ascii_lane(m: &Model, q: u8, p: u8, c: u8) -> u8 {
    let (w, k) = (&m.w, &m.bytes);
    // The class tests of the functions below, on the model's class bytes; as closures,
    // which LLVM compiles to 3% fewer instructions than methods of `ClassBytes`
    // (cachegrind, 5.51 against 5.69 a byte).
    let letter = |x: u8| {
        (x | k.space).wrapping_add(k.letter_shift).cast_signed() > k.letters_below.cast_signed()
    };
    let upper = |x: u8| x.wrapping_add(k.upper_shift).cast_signed() > k.letters_below.cast_signed();
    let digit_ = |x: u8| x.wrapping_add(k.digit_shift).cast_signed() > k.digits_below.cast_signed();
    let alnum_ = |x: u8| letter(x) | digit_(x);
    let punct_ = |x: u8| (x.cast_signed() > k.space.cast_signed()) & !alnum_(x);
    let space_p = p == k.space;
    let alnum_p = alnum_(p);
    let punct_p = punct_(p);
    // Alphanumeric `c`: its own weight, a number starting, a change of class.
    let digit = when(
        digit_(c),
        w[term::DIGIT] + when(!alnum_p, w[term::DIGIT_START]),
    );
    let alnum = when(upper(c), w[term::UPPER]) | digit;
    let transition = when(
        alnum_(c) & alnum_p & ((c ^ p) & k.class_bits != 0),
        w[term::TRANSITION],
    );
    // Punctuation `c`: after punctuation, after neither punctuation nor a space. Written
    // as the most it can weigh less what `p` takes off (`p` is punctuation or a space,
    // not both): one mask fewer. The `u8` arithmetic wraps, and is exact because the
    // result is one of the three sums, each at most 255.
    let punct = when(
        punct_(c),
        w[term::PUNCT]
            .wrapping_add(w[term::PUNCT_START])
            .wrapping_sub(
                when(
                    punct_p,
                    w[term::PUNCT_START].wrapping_sub(w[term::PUNCT_PUNCT]),
                ) | when(space_p, w[term::PUNCT_START]),
            ),
    );
    // A space, newline or tab `c` after another byte.
    let runs = when(
        c != p,
        when(c == k.space, w[term::SPACE_START])
            | when(c == k.newline, w[term::NEWLINE_START])
            | when(c == k.tab, w[term::TAB_START]),
    );
    // An ASCII byte but a space (`c ^ 0x20` positive as `i8`) after two spaces.
    let indent = when(
        ((c ^ k.space).cast_signed() > 0) & space_p & (q == k.space),
        w[term::AFTER_INDENT],
    );
    (alnum | punct | runs) + transition + indent
}

/// The ASCII terms of `VECTOR` bytes `c`, after `p`, after `q` (the same bytes one and
/// two back), a lane each: lane-wise arithmetic on arrays the size of a vector register.
#[inline(always)]
fn vector<const VECTOR: usize>(
    m: &Model,
    q: &[u8; VECTOR],
    p: &[u8; VECTOR],
    c: &[u8; VECTOR],
) -> [u8; VECTOR] {
    let mut lanes = [0u8; VECTOR];
    for j in 0..VECTOR {
        lanes[j] = ascii_lane(m, q[j], p[j], c[j]);
    }
    lanes
}

/// The sum of a vector's lanes (a horizontal byte sum, `psadbw`).
#[inline(always)]
fn lane_sum<const VECTOR: usize>(lanes: [u8; VECTOR]) -> u32 {
    lanes.iter().map(|&lane| u32::from(lane)).sum()
}

/// The weight of one block's bytes, four vectors of `VECTOR` bytes: `c` is the block, `p`
/// the same bytes one back, `q` two back. The ASCII terms vector by vector ([`vector`]),
/// the four vectors written out
/// (LLVM keeps them in registers; a loop over them measured more instructions); the
/// script terms, 0 unless a continuation byte follows a lead byte, are added only in a
/// block where a byte of `c` is not ASCII, one character at a time ([`scripts`]): ASCII
/// pays nothing for them (but in a padded last block, whose padding is not ASCII).
#[inline(always)]
fn block<const BLOCK: usize, const VECTOR: usize>(
    m: &Model,
    q: &[u8; BLOCK],
    p: &[u8; BLOCK],
    c: &[u8; BLOCK],
) -> u32 {
    const { assert!(BLOCK == 4 * VECTOR) };
    let (qs, _) = q.as_chunks::<VECTOR>();
    let (ps, _) = p.as_chunks::<VECTOR>();
    let (cs, _) = c.as_chunks::<VECTOR>();
    let l0 = vector(m, &qs[0], &ps[0], &cs[0]);
    let l1 = vector(m, &qs[1], &ps[1], &cs[1]);
    let l2 = vector(m, &qs[2], &ps[2], &cs[2]);
    let l3 = vector(m, &qs[3], &ps[3], &cs[3]);
    let sum = lane_sum(l0) + lane_sum(l1) + lane_sum(l2) + lane_sum(l3);
    // The largest byte of the block tells both whether it holds non-ASCII bytes and
    // whether one is a four-byte lead.
    let top = largest(c);
    if top >= 0x80 {
        // An emoji's third byte at index `j` has its lead at `j - 2`: in this block, or
        // (for `j < 2`) one of the two bytes before it, `q[0]` and `q[1]`.
        let emoji = if top.max(q[0]).max(q[1]) >= 0xf0 {
            emoji_thirds(m, q, p, c)
        } else {
            0
        };
        sum + scripts(m, p, c) + emoji
    } else {
        sum
    }
}

/// The largest byte of the block (one maximum over it, vectorized).
#[inline(always)]
fn largest<const BLOCK: usize>(x: &[u8; BLOCK]) -> u8 {
    x.iter().fold(0, |acc, &b| acc.max(b))
}

/// Bit 7 of each byte of a `u64`.
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// Bit 7 set in each byte of `x` that is zero, exactly (no borrow crosses a byte: the
/// low seven bits plus `0x7f` stay within the byte).
#[inline(always)]
fn zero_bytes(x: u64) -> u64 {
    const LOW: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    !(((x & LOW) + LOW) | x) & HIGH_BITS
}

/// The emoji terms of a block's third bytes ([`emoji_third`]): eight bytes at a time,
/// skipped at once where no byte two back is `0xf0` or above (no four-byte character
/// starts there), else a `u64` whose bytes have bit 7 set where `q p c` are `0xf0 0x9f`
/// and a continuation byte, and one lookup for each such bit. Called only for a block
/// that holds a four-byte lead or follows one (the block's largest byte, which also
/// tells whether it holds non-ASCII bytes, or the two bytes before it), so text without
/// four-byte characters does not pay for it. Out of line (cold): inlined, it cost the
/// block loop 8 to 11% on the multilingual benchmark, which has no emoji.
#[cold]
#[inline(never)]
fn emoji_thirds<const BLOCK: usize>(
    m: &Model,
    q: &[u8; BLOCK],
    p: &[u8; BLOCK],
    c: &[u8; BLOCK],
) -> u32 {
    let (qs, _) = q.as_chunks::<8>();
    let (ps, _) = p.as_chunks::<8>();
    let (cs, _) = c.as_chunks::<8>();
    let mut sum = 0;
    for ((&q, &p), &c) in qs.iter().zip(ps).zip(cs) {
        let q = u64::from_le_bytes(q);
        // Bits 7 to 4 of a byte shifted onto bit 7: set where the byte is `0xf0..=0xff`.
        if q & (q << 1) & (q << 2) & (q << 3) & HIGH_BITS == 0 {
            continue;
        }
        let p = u64::from_le_bytes(p);
        let c = u64::from_le_bytes(c);
        let mut thirds = zero_bytes(q ^ 0xf0f0_f0f0_f0f0_f0f0)
            & zero_bytes(p ^ 0x9f9f_9f9f_9f9f_9f9f)
            & c
            & !(c << 1);
        while thirds != 0 {
            let shift = thirds.trailing_zeros() & !7;
            // `as u8` keeps the byte at `shift`, the one the bit is in.
            sum += u32::from(m.emoji_third[usize::from((c >> shift) as u8 & 63)]);
            thirds &= thirds - 1;
        }
    }
    sum
}

/// The script weights of a block's characters: eight bytes at a time, a `u64` whose
/// bytes have bit 7 set where `c` is a continuation byte after a lead byte in `p`, and
/// one lookup in [`SCRIPT_CLASS`] for each such bit. The cost follows the number of
/// characters, not of bytes.
#[inline(always)]
fn scripts<const BLOCK: usize>(m: &Model, p: &[u8; BLOCK], c: &[u8; BLOCK]) -> u32 {
    let (leads, _) = p.as_chunks::<8>();
    let (seconds, _) = c.as_chunks::<8>();
    let mut sum = 0;
    for (&lead, &second) in leads.iter().zip(seconds) {
        let lead = u64::from_le_bytes(lead);
        let second = u64::from_le_bytes(second);
        // A lead byte is `0b11xx_xxxx`, a continuation byte `0b10xx_xxxx`: bit 7 of each
        // byte, and bit 6 shifted onto it (what a byte's bit 7 shifts onto is masked).
        let mut pairs = lead & (lead << 1) & second & !(second << 1) & 0x8080_8080_8080_8080;
        while pairs != 0 {
            let shift = pairs.trailing_zeros() & !7;
            // `as u8` keeps the byte at `shift`, the one the bit is in.
            sum += u32::from(m.script_weight((lead >> shift) as u8, (second >> shift) as u8));
            pairs &= pairs - 1;
        }
    }
    sum
}

/// The sum of the weights of `bytes`, [`UNIT`] per estimated token.
///
/// The model goes through `black_box`, which returns it unchanged: with its weights and
/// class bytes as constants of the code, LLVM keeps each vector constant in the constant
/// pool and, short of registers for them all, loads it into a register again before each
/// use (an instruction a use); read from the model, they are splatted once before the
/// loop and used from the stack as memory operands. Measured with cachegrind on the
/// 256 KiB benchmark input: 5.97 instructions a byte with constants, 5.51 without; in
/// time, alternated in one process (best of 3,000), 1.07 times as fast.
fn weight(bytes: &[u8]) -> u64 {
    weight_with(std::hint::black_box(&MODEL), bytes)
}

/// The sum of the weights of `bytes` under the model `m`, whose weights must keep every
/// lane at most 255 (true of [`WEIGHTS`], and of one-hot weights). [`weight`] calls it
/// with [`MODEL`] behind `black_box`, so its weights are read, not constants of the code.
/// The fitting tool calls it with one-hot weights to count how often each term holds.
///
/// On an x86 processor with AVX2 (the x86-64-v3 set, detected once, at the first call, by
/// `fearless_simd`)
/// it runs the wide loop, compiled for AVX2: 32 bytes an instruction; elsewhere the
/// narrow loop, compiled for the target's baseline (SSE2 on x86-64). Both compute the same
/// sum (the tests check both against the formula written plainly); safe code, both of them.
#[inline(always)]
pub(crate) fn weight_with(m: &Model, bytes: &[u8]) -> u64 {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    if let Some(avx2) = fearless_simd::Level::new().as_avx2() {
        use fearless_simd::Simd as _;
        return avx2.vectorize(
            #[inline(always)]
            || weight_in::<{ 4 * WIDE }, WIDE>(m, bytes),
        );
    }
    weight_in::<{ 4 * NARROW }, NARROW>(m, bytes)
}

/// [`weight`] on the narrow loop whatever the processor has: the benchmark's
/// side-by-side figure for processors without AVX2.
#[allow(dead_code, reason = "the benchmark uses it")]
pub(crate) fn weight_narrow(bytes: &[u8]) -> u64 {
    weight_in::<{ 4 * NARROW }, NARROW>(std::hint::black_box(&MODEL), bytes)
}

/// [`weight_with`] in blocks of `BLOCK` bytes, four vectors of `VECTOR` lanes. The bytes
/// after the last whole block (the tail, or the whole text when it is shorter than a
/// block) are weighed as one more block, padded with [`PAD`], whose lanes weigh nothing:
/// one block's time instead of the formula one byte at a time (about 10 ns a byte here:
/// 40-byte texts took 0.41 µs each that way, 0.08 µs so).
#[inline(always)]
fn weight_in<const BLOCK: usize, const VECTOR: usize>(m: &Model, bytes: &[u8]) -> u64 {
    // Bytes 0 and 1 lack a full window; blocks start at byte 2.
    let head = bytes.len().min(2);
    let mut sum: u64 = (0..head).map(|i| weight_at(m, bytes, i)).sum();
    let (whole, lanes) = blocks::<BLOCK, VECTOR>(m, bytes);
    sum += lanes;
    let covered = 2 + BLOCK * whole;
    if covered < bytes.len() {
        // The tail and the two bytes before it, then padding: `covered - 2` is a byte of
        // the text (`covered < len`), and the tail with its two bytes is at most
        // `BLOCK + 1` long, so it fits the `2 * BLOCK` bytes of padding.
        let tail = &bytes[covered - 2..];
        let mut padded = [[PAD; BLOCK]; 2];
        let padded = padded.as_flattened_mut();
        padded[..tail.len()].copy_from_slice(tail);
        sum += blocks::<BLOCK, VECTOR>(m, padded).1;
    }
    // The floor of every byte but the first two, left out of the blocks' lanes.
    sum + (bytes.len() - head) as u64 * u64::from(m.w[term::FLOOR])
}

/// What pads a text's tail to a whole block: `0xc0`, a byte that never occurs in UTF-8.
/// No term holds at it, whatever the bytes before it (it is no letter, digit,
/// punctuation, space, newline or tab, not ASCII, and no continuation byte), and no
/// script term after it (the bytes after it are padding too, never continuation bytes),
/// so its lanes add nothing (`padding_weighs_nothing`); the floor is added only for the
/// text's own bytes.
const PAD: u8 = 0xc0;

/// The whole blocks of `bytes` from byte 2 on: how many, and the sum of their lanes (the
/// floor left out).
#[inline(always)]
fn blocks<const BLOCK: usize, const VECTOR: usize>(m: &Model, bytes: &[u8]) -> (usize, u64) {
    let body = bytes.get(2..).unwrap_or_default();
    let (blocks, _) = body.as_chunks::<BLOCK>();
    let (ones_back, _) = bytes.get(1..).unwrap_or_default().as_chunks::<BLOCK>();
    let (twos_back, _) = bytes.as_chunks::<BLOCK>();
    // The three views have the same blocks at the same indices (`ones_back` and
    // `twos_back` may have one more); zip stops with `blocks`.
    let mut sum = 0;
    for ((c, p), q) in blocks.iter().zip(ones_back).zip(twos_back) {
        sum += u64::from(block::<BLOCK, VECTOR>(m, q, p, c));
    }
    (blocks.len(), sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn est(text: &str) -> u64 {
        Estimator.estimate_text(text)
    }

    /// The fast loop's sum at both widths, which must agree with each other and with
    /// [`weight`] (whichever width this processor runs). The wide loop is compiled here
    /// without AVX2, so this checks its arithmetic; `weight` on a processor with AVX2
    /// checks the code compiled for it.
    fn fast_weight(bytes: &[u8]) -> u64 {
        let narrow = weight_in::<{ 4 * NARROW }, NARROW>(&MODEL, bytes);
        let wide = weight_in::<{ 4 * WIDE }, WIDE>(&MODEL, bytes);
        assert_eq!(narrow, wide, "the two widths disagree");
        assert_eq!(weight(bytes), narrow);
        narrow
    }

    /// The sum of the weights with the fast loop's own functions, byte by byte.
    fn reference_weight(bytes: &[u8]) -> u64 {
        (0..bytes.len()).map(|i| weight_at(&MODEL, bytes, i)).sum()
    }

    /// Which terms hold at byte `c` after `p` after `q` (`None`: before the text), as
    /// the module docs state them, written plainly with the standard library's classes.
    fn plain_terms(q: Option<u8>, p: Option<u8>, c: u8) -> [bool; term::COUNT] {
        let mut t = [false; term::COUNT];
        let punct = |x: u8| x.is_ascii_punctuation() || x == 0x7f;
        let class = |x: u8| {
            if x.is_ascii_lowercase() {
                1
            } else if x.is_ascii_uppercase() {
                2
            } else if x.is_ascii_digit() {
                3
            } else {
                0
            }
        };
        t[term::FLOOR] = true;
        t[term::UPPER] = c.is_ascii_uppercase();
        t[term::DIGIT] = c.is_ascii_digit();
        t[term::PUNCT] = punct(c);
        if let Some(p) = p {
            t[term::DIGIT_START] = c.is_ascii_digit() && !p.is_ascii_alphanumeric();
            t[term::SPACE_START] = c == b' ' && p != b' ';
            t[term::PUNCT_START] = punct(c) && !punct(p) && p != b' ';
            t[term::PUNCT_PUNCT] = punct(c) && punct(p);
            t[term::TRANSITION] = class(c) != 0 && class(p) != 0 && class(c) != class(p);
            t[term::NEWLINE_START] = c == b'\n' && p != b'\n';
            t[term::TAB_START] = c == b'\t' && p != b'\t';
            if (0x80..0xc0).contains(&c)
                && let Some(script) = script_term(p, c)
            {
                t[script] = true;
            }
            if let Some(q) = q {
                t[term::AFTER_INDENT] = c.is_ascii() && c != b' ' && p == b' ' && q == b' ';
                // U+1F000 + 64 × (c - 0x80): the block of 64 the emoji is in.
                let popular = matches!(c, 0x87 | 0x8c..=0x94 | 0x98..=0x9a | 0xa4..=0xa5);
                t[term::EMOJI_RARE] =
                    q == 0xf0 && p == 0x9f && (0x80..0xc0).contains(&c) && !popular;
            }
        }
        t
    }

    /// The one-hot weights of term `k`: counting with them counts where `k` holds.
    fn one_hot(k: usize) -> Weights {
        let mut w = [0; term::COUNT];
        w[k] = 1;
        w
    }

    #[test]
    fn weights_are_non_negative_and_fit_a_lane() {
        // `T` reads the byte two back only through `is_space` and whether it is `0xf0`: a
        // space, a letter and `0xf0` stand for all of them; every pair of the byte before
        // and the byte itself.
        for q in [b' ', b'x', 0xf0] {
            for p in 0..=255u8 {
                for c in 0..=255u8 {
                    // Terms are u8 (never negative); their sum in u16 must fit a u8 lane.
                    let whole = u16::from(own(&MODEL, c))
                        + u16::from(pair(&MODEL, p, c))
                        + u16::from(triple(&MODEL, q, p, c));
                    assert!(whole <= 255, "overflow at {q:#x} {p:#x} {c:#x}");
                    assert_eq!(u16::from(lane(&MODEL, q, p, c)), whole);
                }
            }
        }
    }

    #[test]
    fn fast_lane_equals_the_plain_terms() {
        // The fast functions (a table for scripts, `|` for disjoint terms) compute the
        // formula as the docs state it, for every window: with the fitted weights, and
        // term by term with one-hot weights (which is how the fitting tool counts terms).
        let one_hots: Vec<Model> = (0..term::COUNT).map(|k| Model::new(&one_hot(k))).collect();
        let check = |q: Option<u8>, p: Option<u8>, c: u8| {
            let terms = plain_terms(q, p, c);
            let fast = |m: &Model| match (q, p) {
                (Some(q), Some(p)) => u64::from(lane(m, q, p, c)),
                (None, Some(p)) => u64::from(own(m, c) + pair(m, p, c)),
                _ => u64::from(own(m, c)),
            };
            let plain: u64 = terms
                .iter()
                .zip(&WEIGHTS)
                .filter(|&(&on, _)| on)
                .map(|(_, &weight)| u64::from(weight))
                .sum();
            assert_eq!(fast(&MODEL), plain, "{q:?} {p:?} {c:#x}");
            for (k, w) in one_hots.iter().enumerate() {
                assert_eq!(
                    fast(w),
                    u64::from(terms[k]),
                    "{} at {q:?} {p:?} {c:#x}",
                    term::NAMES[k]
                );
            }
        };
        for c in 0..=255u8 {
            check(None, None, c);
            for p in 0..=255u8 {
                check(None, Some(p), c);
                // `T` reads the byte two back only through `is_space` and whether it is
                // `0xf0`.
                for q in [b' ', b'x', 0xf0] {
                    check(Some(q), Some(p), c);
                }
            }
        }
    }

    #[test]
    fn fast_lane_regroups_the_ascii_terms() {
        // The block loop's regrouping of the ASCII terms by the class of `c` is the sum of
        // the terms as `lane` adds them, for every window, with the fitted weights and with
        // each one-hot model (how the fitting tool counts terms through the same loop).
        let models: Vec<Model> = std::iter::once(MODEL)
            .chain((0..term::COUNT).map(|k| Model::new(&one_hot(k))))
            .collect();
        for m in &models {
            // Both read the byte two back only through `is_space`.
            for q in [b' ', b'x'] {
                for p in 0..=255u8 {
                    for c in 0..=255u8 {
                        let terms =
                            own_classes(m, c) + ascii_pair(m, p, c) + ascii_triple(m, q, p, c);
                        assert_eq!(ascii_lane(m, q, p, c), terms, "{q:#x} {p:#x} {c:#x}");
                    }
                }
            }
        }
    }

    #[test]
    fn script_terms_name_the_blocks() {
        let script = |ch: char| {
            let mut buf = [0; 4];
            let bytes = ch.encode_utf8(&mut buf).as_bytes();
            script_term(bytes[0], bytes[1]).map(|k| term::NAMES[k])
        };
        let cases = [
            ('é', "LATIN1"),
            ('ł', "LATIN_EXT_A"),
            ('ư', "LATIN_EXT_B"),
            ('ș', "LATIN_EXT_B"),
            ('\u{301}', "COMBINING"),
            ('λ', "GREEK"),
            ('ж', "CYRILLIC"),
            ('ש', "HEBREW"),
            ('ա', "ARMENIAN"),
            ('ب', "ARABIC"),
            ('क', "DEVANAGARI"),
            ('త', "TELUGU"),
            ('ம', "INDIC"),
            ('ক', "INDIC"),
            ('ક', "INDIC"),
            ('ക', "INDIC"),
            ('ਕ', "GURMUKHI_SINHALA"),
            ('ක', "GURMUKHI_SINHALA"),
            ('ଓ', "ORIYA"),
            ('ก', "THAI_LAO"),
            ('ກ', "THAI_LAO"),
            ('ཀ', "TIBETAN"),
            ('ა', "E1"),
            ('က', "E1"),
            ('ក', "E1"),
            ('ệ', "LATIN_EXT_ADDITIONAL"),
            ('—', "SYMBOL"),
            ('─', "SYMBOL"),
            ('あ', "KANA"),
            ('。', "KANA"),
            ('中', "HAN"),
            ('한', "HANGUL"),
            ('（', "FULLWIDTH"),
            ('\u{1d400}', "ASTRAL"),
            ('\u{20000}', "ASTRAL"),
            // Emoji (written escaped: this file is in the accuracy corpus's Rust).
            ('\u{1f600}', "EMOJI"),
            ('\u{1f1fa}', "EMOJI"),
            ('\u{1f3fd}', "EMOJI"),
            ('\u{1fae0}', "EMOJI"),
            ('\u{2600}', "SYMBOL"),
            ('\u{200d}', "SYMBOL"),
            ('\u{fe0f}', "FULLWIDTH"),
        ];
        for (ch, name) in cases {
            assert_eq!(script(ch), Some(name), "{ch}");
        }
        assert_eq!(script_term(0xc0, 0x80), None);
        assert_eq!(script_term(b'a', 0x80), None);
    }

    #[test]
    fn term_names_match_their_indices() {
        let named = [
            (term::FLOOR, "FLOOR"),
            (term::TELUGU, "TELUGU"),
            (term::ASTRAL, "ASTRAL"),
            (term::AFTER_INDENT, "AFTER_INDENT"),
            (term::EMOJI, "EMOJI"),
        ];
        for (k, name) in named {
            assert_eq!(term::NAMES[k], name);
        }
        assert_eq!(term::EMOJI_RARE + 1, term::COUNT);
    }

    #[test]
    fn padding_weighs_nothing() {
        // After any two bytes, and after padding, for every term alone: no ASCII term and
        // no script term holds at the padding byte.
        let models: Vec<Model> = (0..term::COUNT)
            .map(|k| Model::new(&one_hot(k)))
            .chain([MODEL])
            .collect();
        for m in &models {
            for q in 0..=255u8 {
                for p in 0..=255u8 {
                    assert_eq!(ascii_lane(m, q, p, PAD), 0, "{q:#x} {p:#x}");
                    assert_eq!(script(m, p, PAD), 0, "{p:#x}");
                    assert_eq!(emoji_third(m, q, p, PAD), 0, "{q:#x} {p:#x}");
                }
            }
        }
        assert!(std::str::from_utf8(&[PAD, 0x80]).is_err(), "never in UTF-8");
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
    fn fast_loop_matches_the_plain_formula_on_long_texts() {
        // Hundreds of blocks with an odd tail; every kind of byte.
        let bytes: Vec<u8> = (0..40_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        assert_eq!(fast_weight(&bytes), reference_weight(&bytes));
        let text =
            "ZGF0YTppbWFnZS9wbmc7YmFzZTY0 {\"id\": 12345, \"name\": \"中文\"}\n    x".repeat(700);
        assert_eq!(
            fast_weight(text.as_bytes()),
            reference_weight(text.as_bytes())
        );
        // The largest lane weight on every byte still sums exactly.
        let worst = [0xe4u8, 0x01].repeat(20_000);
        assert_eq!(fast_weight(&worst), reference_weight(&worst));
    }

    #[test]
    fn fast_loop_weighs_every_pair_at_every_lane() {
        // Every pair of bytes (so every lead byte before every continuation byte, and
        // every other pair), at each of the eight positions a byte can have in a `u64` of
        // the script pass, and across every block boundary: the blocks and the bytes one
        // at a time agree.
        let pairs: Vec<u8> = (0..=255u8)
            .flat_map(|p| (0..=255u8).flat_map(move |c| [p, c]))
            .collect();
        for shift in 0..8 {
            let mut bytes = vec![b'a'; shift];
            for (k, pair) in pairs.chunks(2).enumerate() {
                bytes.extend_from_slice(pair);
                // An odd gap now and then moves the pairs' phase within the blocks.
                if k % 7 == 0 {
                    bytes.push(b' ');
                }
            }
            assert_eq!(
                fast_weight(&bytes),
                reference_weight(&bytes),
                "shift {shift}"
            );
        }
    }

    #[test]
    fn fast_loop_weighs_every_emoji_third_byte_at_every_lane() {
        // `0xf0 0x9f` before every byte, and near misses (`0xf1 0x9f`, `0xf0 0x9e`), at
        // each of the eight positions a byte can have in a `u64` of the emoji pass and
        // across block boundaries; and real emoji of every block, in runs.
        let mut triples = Vec::new();
        for c in 0..=255u8 {
            for (q, p) in [(0xf0, 0x9f), (0xf1, 0x9f), (0xf0, 0x9e), (0xff, 0x9f)] {
                triples.extend_from_slice(&[q, p, c]);
            }
        }
        for shift in 0..8 {
            let mut bytes = vec![b'a'; shift];
            for (k, triple) in triples.chunks(3).enumerate() {
                bytes.extend_from_slice(triple);
                if k % 5 == 0 {
                    bytes.push(b' ');
                }
            }
            assert_eq!(
                fast_weight(&bytes),
                reference_weight(&bytes),
                "shift {shift}"
            );
        }
        let emoji: String = (0x1f000..0x20000u32).filter_map(char::from_u32).collect();
        for skip in 0..5 {
            let text = &emoji.as_bytes()[skip..];
            assert_eq!(fast_weight(text), reference_weight(text), "skip {skip}");
        }
        // With the fitted weights: a popular emoji (U+1F600) weighs less than a rare one
        // (U+1F004, a mahjong tile), both more than any other four-byte character.
        let one = |ch: u32| weight(char::from_u32(ch).unwrap().to_string().as_bytes());
        assert!(
            one(0x1f600) < one(0x1f004),
            "{} {}",
            one(0x1f600),
            one(0x1f004)
        );
        assert!(one(0x1f600) > one(0x1d400));
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
            // Long runs across block boundaries (64 and 128 bytes): base64-like, lowercase,
            // spaces.
            let runs: Vec<u8> =
                runs.into_iter().flat_map(|(b, n)| std::iter::repeat_n(b, n)).collect();
            let mixed: Vec<u8> =
                runs.iter().zip(bytes.iter().cycle()).flat_map(|(&a, &b)| [a, b]).collect();
            proptest::prop_assert_eq!(fast_weight(&runs), reference_weight(&runs));
            proptest::prop_assert_eq!(fast_weight(&mixed), reference_weight(&mixed));
            proptest::prop_assert_eq!(fast_weight(&bytes), reference_weight(&bytes));
            proptest::prop_assert_eq!(fast_weight(text.as_bytes()), reference_weight(text.as_bytes()));
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
    fn monotone_under_appending_and_prepending_not_in_length() {
        // What the docs claim, and what they must not: a longer text can estimate fewer
        // tokens (digits start a token each pair; lowercase runs are nearly free), but text
        // added at either end never lowers the estimate.
        let (digits, letters) = ("0123456789", "abcdefghijkl");
        assert_eq!((est(digits), est(letters)), (3, 1));
        assert!(letters.len() > digits.len());
        for (a, b) in [(digits, letters), (letters, digits)] {
            let ab = format!("{a}{b}");
            assert!(est(&ab) >= est(a).max(est(b)), "{ab:?}");
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
