//! What a Run spent: provider-reported usage records summed, never estimates.

use psych_types::{HistoryEntry, HistoryItem, LoggedRecord, Record, Usage};
use serde::Serialize;

/// The tokens spent by the model calls of a Run, from its [`Record::Usage`] records alone
/// (the provider's own counts). Token estimates never enter it: they decide thresholds
/// (disclosure's budgets, elision's plan) and are labelled as estimates where shown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Spent {
    /// Model calls whose usage was reported.
    pub calls: u64,
    /// The four counts summed over those calls.
    pub usage: Usage,
}

impl Spent {
    /// Every token billed (the four counts together).
    pub fn total(&self) -> u64 {
        self.usage.total()
    }
}

impl Spent {
    /// Adds the usage records among `entries` (a Run's history as it grows).
    pub(crate) fn tally(&mut self, entries: &[HistoryEntry]) {
        for entry in entries {
            if let HistoryItem::Record(Record::Usage(usage)) = &entry.item {
                self.add(usage);
            }
        }
    }

    fn add(&mut self, usage: &Usage) {
        self.calls += 1;
        self.usage = self.usage.plus(usage);
    }
}

/// Sums the usage records of `records`.
pub fn spent(records: &[LoggedRecord]) -> Spent {
    let mut sum = Spent::default();
    for logged in records {
        if let Record::Usage(usage) = &logged.record {
            sum.add(usage);
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_types::{RecordHandle, RunId, UserMessage};

    #[test]
    fn only_usage_records_count() {
        let run = RunId::new("run-1").unwrap_or_else(|_| unreachable!());
        let at = |seq, record| LoggedRecord {
            handle: RecordHandle::new(run.clone(), seq),
            record,
        };
        let usage = |input, output| Usage {
            input,
            cache_read: 10,
            cache_write: 5,
            output,
        };
        let records = [
            at(
                0,
                Record::User(UserMessage {
                    text: "x".repeat(4_000),
                }),
            ),
            at(1, Record::Usage(usage(100, 7))),
            at(2, Record::Usage(usage(40, 3))),
        ];
        let spent = spent(&records);
        assert_eq!(spent.calls, 2);
        assert_eq!(spent.usage.input, 140);
        assert_eq!(spent.usage.output, 10);
        assert_eq!(spent.total(), 140 + 20 + 10 + 10);
        assert_eq!(super::spent(&records[..1]), Spent::default());

        // Tallied over a history as it grows: the same sum.
        let history = psych_types::History::from_records(&records, None);
        let mut tallied = Spent::default();
        tallied.tally(&history.entries[..2]);
        tallied.tally(&history.entries[2..]);
        assert_eq!(tallied, spent);
    }
}
