//! What a Run spent: provider-reported usage records summed, never estimates.

use psych_types::{LoggedRecord, Record, Usage};
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

/// Sums the usage records of `records`.
pub fn spent(records: &[LoggedRecord]) -> Spent {
    records
        .iter()
        .filter_map(|logged| match &logged.record {
            Record::Usage(usage) => Some(usage),
            _ => None,
        })
        .fold(Spent::default(), |sum, usage| Spent {
            calls: sum.calls + 1,
            usage: sum.usage.plus(usage),
        })
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
    }
}
