//! The stores' conformance suite (psych-store-conformance) run against the record log, under
//! both durable policies: the guarantees the PostgreSQL store is held to as well.

use psych_record_log::{SharedRecordLog, SyncPolicy};
use psych_types::RunId;

/// Opens Runs' logs in a folder of their own, removed with the closure.
fn place(policy: SyncPolicy) -> impl Fn(&RunId) -> SharedRecordLog {
    let dir = tempfile::tempdir().unwrap();
    move |run: &RunId| SharedRecordLog::open(dir.path(), run, policy).unwrap().0
}

mod every_append {
    psych_store_conformance::records_conformance!(|| super::place(
        psych_record_log::SyncPolicy::EveryAppend
    ));
}

mod group_commit {
    psych_store_conformance::records_conformance!(|| super::place(
        psych_record_log::SyncPolicy::GroupCommit(psych_record_log::GroupCommit::default())
    ));
}
