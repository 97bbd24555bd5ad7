//! Model-based test: random appends, batches, concurrent appends through a
//! `SharedRecordLog`, reopens and reads against `psych_types::MemoryRecords` (a `Vec` of
//! records), compared after every step.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use proptest::prelude::*;
use psych_record_log::{RecordLog, SharedRecordLog, SyncPolicy};
use psych_types::{MemoryRecords, Record, RecordHandle, RecordSource};

#[derive(Debug, Clone)]
enum Op {
    Append(Record),
    Batch(Vec<Record>),
    /// Each record appended by its own thread at once, through a shared log.
    Concurrent(Vec<Record>),
    Reopen,
    /// Read record `pick % len` whole and a slice of its output at `offset`.
    Read {
        pick: usize,
        offset: u64,
        len: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => common::any_record().prop_map(Op::Append),
        1 => prop::collection::vec(common::any_record(), 0..5).prop_map(Op::Batch),
        1 => prop::collection::vec(common::any_record(), 1..5).prop_map(Op::Concurrent),
        1 => Just(Op::Reopen),
        3 => (any::<usize>(), 0u64..4000, 0usize..200)
            .prop_map(|(pick, offset, len)| Op::Read { pick, offset, len }),
    ]
}

/// The log and the model agree on record `seq` in every way a reader can ask.
fn same_at(log: &RecordLog, model: &MemoryRecords, seq: u64, offset: u64, len: usize) {
    let handle = RecordHandle::new(log.run().clone(), seq);
    assert_eq!(log.record(&handle).unwrap(), model.record(&handle).unwrap());
    assert_eq!(
        log.output_info(&handle).unwrap(),
        model.output_info(&handle).unwrap()
    );
    let (mut got, mut want) = (vec![0u8; len], vec![0u8; len]);
    let n = log.read_output(&handle, offset, &mut got).unwrap();
    let m = model.read_output(&handle, offset, &mut want).unwrap();
    assert_eq!(
        got[..n],
        want[..m],
        "read_output({handle}, {offset}, {len})"
    );
    // Every block, binary data included, by position; one past the end is `None` in both.
    for position in 0..8 {
        assert_eq!(
            log.content_block(&handle, position).unwrap(),
            model.content_block(&handle, position).unwrap(),
            "content_block({handle}, {position})"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn log_behaves_like_a_vec(ops in prop::collection::vec(op(), 1..30)) {
        let dir = tempfile::tempdir().unwrap();
        let run = common::run("model");
        let open = || RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        let (mut log, recovery) = open();
        prop_assert!(recovery.is_clean());
        let mut model = MemoryRecords::new(run.clone());
        for op in ops {
            match op {
                Op::Append(record) => {
                    let handle = log.append(&record).unwrap();
                    prop_assert_eq!(handle, model.push(record));
                }
                Op::Batch(records) => {
                    let handles = log.append_batch(&records).unwrap();
                    let expected: Vec<_> = records.into_iter().map(|r| model.push(r)).collect();
                    prop_assert_eq!(handles, expected);
                }
                Op::Concurrent(records) => {
                    let shared = SharedRecordLog::new(log);
                    let mut acked: Vec<(RecordHandle, Record)> = std::thread::scope(|scope| {
                        let threads: Vec<_> = records
                            .into_iter()
                            .map(|record| {
                                let shared = &shared;
                                scope.spawn(move || (shared.append(&record).unwrap(), record))
                            })
                            .collect();
                        threads.into_iter().map(|t| t.join().unwrap()).collect()
                    });
                    // Whatever order the threads won, positions are dense and in file order.
                    acked.sort_by_key(|(handle, _)| handle.seq);
                    for (handle, record) in acked {
                        let stored = shared.record(&handle).unwrap();
                        prop_assert_eq!(stored.as_ref(), Some(&record));
                        prop_assert_eq!(handle, model.push(record));
                    }
                    log = shared.into_inner();
                }
                Op::Reopen => {
                    drop(log);
                    let (reopened, recovery) = open();
                    log = reopened;
                    prop_assert!(recovery.is_clean(), "{}", recovery);
                    prop_assert_eq!(recovery.records, model.records().len() as u64);
                    let all: Vec<_> = log.iter().collect::<Result<_, _>>().unwrap();
                    prop_assert_eq!(all, model.records());
                }
                Op::Read { pick, offset, len } => {
                    let count = model.records().len() as u64;
                    if count > 0 {
                        same_at(&log, &model, pick as u64 % count, offset, len);
                    }
                    // One past the end never resolves.
                    same_at(&log, &model, count, 0, 8);
                }
            }
            prop_assert_eq!(log.len(), model.records().len() as u64);
        }
    }
}
