//! The inputs of the three zones the caller fills: the static system sections (zone 1), the
//! dynamic system tail (zone 2) and the transient message (zone 4), with the one type that
//! carries a clock, [`CurrentTime`], accepted by [`Transient`] alone.

use std::fmt;

/// Zone 1: the static system prompt sections, rendered in a fixed order: instructions, the
/// skills index, the subagent roster, capability notes.
///
/// Skills and subagents are index entries (a name and a one-line description) and are sorted
/// by name (then description) when rendered, so the order callers collect them in (a hash
/// map's, say) cannot leak into the bytes. Capability notes are prose and keep the order
/// given; deferred-server lines from disclosure arrive here, one note per server, already
/// ordered by disclosure.
///
/// There is no field for a date or time: the clock belongs in [`Transient`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaticSections {
    pub(crate) instructions: String,
    pub(crate) skills: Vec<IndexEntry>,
    pub(crate) subagents: Vec<IndexEntry>,
    pub(crate) capability_notes: Vec<String>,
}

/// One line of the skills index or the subagent roster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct IndexEntry {
    pub(crate) name: String,
    pub(crate) description: String,
}

impl StaticSections {
    /// Sections with these instructions and nothing else.
    pub fn new(instructions: impl Into<String>) -> Self {
        Self {
            instructions: instructions.into(),
            ..Self::default()
        }
    }

    /// Adds a skill to the index: its name and description only (the body loads on demand).
    #[must_use]
    pub fn skill(mut self, name: impl Into<String>, description: impl Into<String>) -> Self {
        self.skills.push(IndexEntry {
            name: name.into(),
            description: description.into(),
        });
        self
    }

    /// Adds a subagent to the roster.
    #[must_use]
    pub fn subagent(mut self, name: impl Into<String>, description: impl Into<String>) -> Self {
        self.subagents.push(IndexEntry {
            name: name.into(),
            description: description.into(),
        });
        self
    }

    /// Adds a capability note (for example one deferred server's line), kept in the order
    /// given.
    #[must_use]
    pub fn capability_note(mut self, note: impl Into<String>) -> Self {
        self.capability_notes.push(note.into());
        self
    }

    /// The non-empty sections as text, in zone order.
    pub(crate) fn sections(&self) -> Vec<String> {
        let mut sections = Vec::with_capacity(4);
        // Whitespace-only instructions are no section (Anthropic refuses a blank text block).
        if !crate::render::is_blank(&self.instructions) {
            sections.push(self.instructions.clone());
        }
        if !self.skills.is_empty() {
            sections.push(index_section(
                "Skills (load a skill's full instructions only when you need it):",
                &self.skills,
            ));
        }
        if !self.subagents.is_empty() {
            sections.push(index_section(
                "Subagents you can delegate to:",
                &self.subagents,
            ));
        }
        if !self.capability_notes.is_empty() {
            let mut text = String::from("Capability notes:");
            for note in &self.capability_notes {
                text.push_str("\n- ");
                text.push_str(note);
            }
            sections.push(text);
        }
        sections
    }
}

fn index_section(heading: &str, entries: &[IndexEntry]) -> String {
    let mut sorted: Vec<&IndexEntry> = entries.iter().collect();
    sorted.sort();
    let mut text = String::from(heading);
    for entry in sorted {
        text.push_str("\n- ");
        text.push_str(&entry.name);
        if !entry.description.is_empty() {
            text.push_str(": ");
            text.push_str(&entry.description);
        }
    }
    text
}

/// Zone 2: the single dynamic tail of the system prompt: memories and anything else that is
/// per-user and may change mid-conversation. It is rendered last in the system prompt so a
/// change here invalidates nothing above it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DynamicTail {
    pub(crate) memories: Vec<String>,
    pub(crate) notes: Vec<(String, String)>,
}

impl DynamicTail {
    /// An empty tail (rendered as nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a memory, kept in the order given.
    #[must_use]
    pub fn memory(mut self, text: impl Into<String>) -> Self {
        self.memories.push(text.into());
        self
    }

    /// Adds a headed note (a user profile, a per-user setting), rendered after the memories
    /// in the order given.
    #[must_use]
    pub fn note(mut self, heading: impl Into<String>, body: impl Into<String>) -> Self {
        self.notes.push((heading.into(), body.into()));
        self
    }

    /// Whether there is nothing to render.
    pub fn is_empty(&self) -> bool {
        self.memories.is_empty() && self.notes.is_empty()
    }

    /// The tail as one text, or `None` when empty.
    pub(crate) fn text(&self) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let mut parts = Vec::with_capacity(1 + self.notes.len());
        if !self.memories.is_empty() {
            let mut text = String::from("Memories:");
            for memory in &self.memories {
                text.push_str("\n- ");
                text.push_str(memory);
            }
            parts.push(text);
        }
        for (heading, body) in &self.notes {
            parts.push(format!("{heading}:\n{body}"));
        }
        Some(parts.join("\n\n"))
    }
}

/// Zone 4: the one trailing message appended after the history on every call and never
/// persisted. The current date and time live here and nowhere else: [`CurrentTime`] is
/// accepted by no other input of this crate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transient {
    pub(crate) now: Option<CurrentTime>,
    pub(crate) notes: Vec<String>,
}

impl Transient {
    /// An empty transient message (rendered as no message at all).
    pub fn new() -> Self {
        Self::default()
    }

    /// A transient message carrying the current date and time.
    pub fn at(now: CurrentTime) -> Self {
        Self {
            now: Some(now),
            notes: Vec::new(),
        }
    }

    /// Adds a per-call note (a reminder, a budget line) after the clock.
    #[must_use]
    pub fn note(mut self, text: impl Into<String>) -> Self {
        self.notes.push(text.into());
        self
    }

    /// The message text, or `None` when there is nothing to say.
    pub(crate) fn text(&self) -> Option<String> {
        let mut lines = Vec::with_capacity(1 + self.notes.len());
        if let Some(now) = &self.now {
            lines.push(format!("Current date and time: {now}"));
        }
        lines.extend(
            self.notes
                .iter()
                .filter(|n| !crate::render::is_blank(n))
                .cloned(),
        );
        (!lines.is_empty()).then(|| lines.join("\n"))
    }
}

/// Why a [`CurrentTime`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimeError {
    /// The local date falls outside the years 0000 to 9999, which RFC 3339 cannot print.
    #[error("unix time {seconds} with offset {offset_minutes} min is outside years 0000-9999")]
    OutOfRange {
        /// The seconds given.
        seconds: i64,
        /// The offset given.
        offset_minutes: i16,
    },
    /// The UTC offset is not within ±23:59.
    #[error("UTC offset {0} min is not within ±23:59")]
    BadOffset(i16),
}

/// A wall-clock instant with its UTC offset, printed as RFC 3339 with the weekday, for
/// example `2026-11-30T12:24:57Z (Monday)`.
///
/// This crate has no clock: the caller reads one and passes it here, and the only input
/// that accepts a `CurrentTime` is [`Transient::at`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CurrentTime {
    seconds: i64,
    offset_minutes: i16,
}

/// Local seconds of 0000-01-01T00:00:00 and 9999-12-31T23:59:59.
const MIN_LOCAL: i64 = -62_167_219_200;
const MAX_LOCAL: i64 = 253_402_300_799;

impl CurrentTime {
    /// An instant given as seconds since the Unix epoch, shown at a UTC offset in minutes.
    ///
    /// # Errors
    ///
    /// [`TimeError`] when the offset is beyond ±23:59 or the local date is outside years
    /// 0000 to 9999.
    pub fn from_unix(seconds: i64, utc_offset_minutes: i16) -> Result<Self, TimeError> {
        if utc_offset_minutes.unsigned_abs() > 23 * 60 + 59 {
            return Err(TimeError::BadOffset(utc_offset_minutes));
        }
        let local = seconds.checked_add(i64::from(utc_offset_minutes) * 60);
        match local {
            Some(local) if (MIN_LOCAL..=MAX_LOCAL).contains(&local) => Ok(Self {
                seconds,
                offset_minutes: utc_offset_minutes,
            }),
            _ => Err(TimeError::OutOfRange {
                seconds,
                offset_minutes: utc_offset_minutes,
            }),
        }
    }

    /// An instant in UTC.
    ///
    /// # Errors
    ///
    /// [`TimeError::OutOfRange`] outside years 0000 to 9999.
    pub fn utc(seconds: i64) -> Result<Self, TimeError> {
        Self::from_unix(seconds, 0)
    }

    /// Seconds since the Unix epoch.
    pub fn unix_seconds(&self) -> i64 {
        self.seconds
    }
}

impl fmt::Display for CurrentTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let local = self.seconds + i64::from(self.offset_minutes) * 60;
        let days = local.div_euclid(86_400);
        let secs = local.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        const WEEKDAYS: [&str; 7] = [
            "Sunday",
            "Monday",
            "Tuesday",
            "Wednesday",
            "Thursday",
            "Friday",
            "Saturday",
        ];
        // 1970-01-01 was a Thursday; rem_euclid keeps the index in 0..7.
        let weekday = WEEKDAYS[usize::try_from((days + 4).rem_euclid(7)).unwrap_or(0)];
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        )?;
        if self.offset_minutes == 0 {
            f.write_str("Z")?;
        } else {
            let sign = if self.offset_minutes < 0 { '-' } else { '+' };
            let abs = self.offset_minutes.unsigned_abs();
            write!(f, "{sign}{:02}:{:02}", abs / 60, abs % 60)?;
        }
        write!(f, " ({weekday})")
    }
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_rfc3339_with_weekday() {
        let t = CurrentTime::utc(1_796_041_497).unwrap();
        assert_eq!(t.to_string(), "2026-11-30T12:24:57Z (Monday)");
        let t = CurrentTime::from_unix(0, -330).unwrap();
        assert_eq!(t.to_string(), "1969-12-31T18:30:00-05:30 (Wednesday)");
        let t = CurrentTime::from_unix(951_782_400, 60).unwrap();
        assert_eq!(t.to_string(), "2000-02-29T01:00:00+01:00 (Tuesday)");
        assert_eq!(
            CurrentTime::utc(MIN_LOCAL).unwrap().to_string(),
            "0000-01-01T00:00:00Z (Saturday)"
        );
        assert_eq!(
            CurrentTime::utc(MAX_LOCAL).unwrap().to_string(),
            "9999-12-31T23:59:59Z (Friday)"
        );
    }

    #[test]
    fn refuses_out_of_range() {
        assert_eq!(
            CurrentTime::from_unix(0, 1440),
            Err(TimeError::BadOffset(1440))
        );
        assert!(matches!(
            CurrentTime::utc(MAX_LOCAL + 1),
            Err(TimeError::OutOfRange { .. })
        ));
        assert!(matches!(
            CurrentTime::from_unix(i64::MAX, 60),
            Err(TimeError::OutOfRange { .. })
        ));
    }

    #[test]
    fn index_sections_sort_and_notes_keep_order() {
        let sections = StaticSections::new("Be brief.")
            .skill("zeta", "last")
            .skill("alpha", "first")
            .capability_note("second note")
            .capability_note("first note")
            .sections();
        assert_eq!(
            sections,
            vec![
                "Be brief.".to_owned(),
                "Skills (load a skill's full instructions only when you need it):\n- alpha: first\n- zeta: last".to_owned(),
                "Capability notes:\n- second note\n- first note".to_owned(),
            ]
        );
    }

    #[test]
    fn empty_transient_and_tail_render_nothing() {
        assert_eq!(Transient::new().text(), None);
        assert_eq!(Transient::new().note("").text(), None);
        assert_eq!(DynamicTail::new().text(), None);
        assert_eq!(
            DynamicTail::new()
                .memory("a")
                .note("Profile", "b")
                .text()
                .as_deref(),
            Some("Memories:\n- a\n\nProfile:\nb")
        );
    }
}
