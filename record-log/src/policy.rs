//! [`SyncPolicy`]: when an append is acknowledged; and [`GroupCommit`], the bounds of a
//! group, built and checked by [`GroupCommitBuilder`].

use std::time::Duration;

use crate::error::PolicyError;

/// The longest [`GroupCommit::max_wait`] a log accepts: an appender blocked longer than this
/// for company is a misconfiguration, not a tuning choice.
pub const MAX_GROUP_WAIT: Duration = Duration::from_secs(1);

/// When an append is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SyncPolicy {
    /// Every [`RecordLog::append`](crate::RecordLog::append) and every
    /// [`RecordLog::append_batch`](crate::RecordLog::append_batch) ends with one `fdatasync`
    /// (`File::sync_data`); handles are returned only after it succeeded, so an acknowledged
    /// record survives a process kill, an OS crash and a power loss. `append_batch` commits
    /// the caller's batch with one sync. Through a
    /// [`SharedRecordLog`](crate::SharedRecordLog), concurrent appends are still synced one
    /// call at a time (groups of one call, no waiting).
    #[default]
    EveryAppend,
    /// Group commit with a bounded window, for a log shared by concurrent appenders
    /// ([`SharedRecordLog`](crate::SharedRecordLog)): appends arriving together are written
    /// by one leader thread in one write and made durable by ONE `fdatasync`, and each
    /// appender gets its handle only after that sync, so the durability promise is the one
    /// of [`SyncPolicy::EveryAppend`]. The group's bounds are the [`GroupCommit`]'s. Only
    /// appenders on different OS threads group: each appender blocks its thread until its
    /// group is durable, so tasks of one async runtime must append from
    /// `spawn_blocking` (or a writer thread per appender) to share a group.
    ///
    /// On a [`RecordLog`](crate::RecordLog) used directly (one appender, `&mut self`) there
    /// is nobody to group with: each call is synced at once, as under
    /// [`SyncPolicy::EveryAppend`].
    GroupCommit(GroupCommit),
    /// No sync on append: records reach the OS page cache (they survive the process being
    /// killed, not an OS crash or power loss) and are durable only after
    /// [`RecordLog::sync`](crate::RecordLog::sync). For bulk loading and tests.
    OsBuffered,
}

impl SyncPolicy {
    /// Whether an append under this policy ends with an `fdatasync`.
    pub(crate) fn syncs(self) -> bool {
        !matches!(self, SyncPolicy::OsBuffered)
    }
}

/// The bounds of a group under [`SyncPolicy::GroupCommit`]: a group closes when it holds
/// `max_records` records or `max_bytes` bytes of frames, or when its oldest append has
/// waited `max_wait`, whichever comes first; a call's records are never split between
/// groups (a call larger than a bound forms a group of its own). Built by
/// [`GroupCommit::builder`], which checks the bounds, so a `GroupCommit` always holds.
///
/// ```
/// use std::time::Duration;
///
/// use psych_record_log::{GroupCommit, PolicyError, SyncPolicy};
///
/// let window = GroupCommit::builder().max_wait(Duration::from_millis(5)).build()?;
/// assert_eq!((window.max_records(), window.max_bytes()), (64, 8 << 20));
/// let _policy = SyncPolicy::GroupCommit(window);
/// assert_eq!(GroupCommit::builder().max_records(0).build(), Err(PolicyError::ZeroMaxRecords));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommit {
    max_wait: Duration,
    max_records: usize,
    max_bytes: u64,
}

impl Default for GroupCommit {
    /// A 2 ms window, 64 records, 8 MiB.
    fn default() -> Self {
        Self {
            max_wait: Duration::from_millis(2),
            max_records: 64,
            max_bytes: 8 << 20,
        }
    }
}

impl GroupCommit {
    /// A builder starting from the defaults: a 2 ms window, at most 64 records and 8 MiB
    /// of frames a group.
    pub fn builder() -> GroupCommitBuilder {
        GroupCommitBuilder::default()
    }

    /// How long a group stays open for more appends, counted from its oldest append's
    /// arrival: the most an appender waits for company. At most [`MAX_GROUP_WAIT`]; zero
    /// groups only what queued up while the previous group was being synced.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// Most records in one group (at least 1).
    pub fn max_records(&self) -> usize {
        self.max_records
    }

    /// Most bytes of frames in one group (at least 1).
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }
}

/// Builds a [`GroupCommit`], starting from its defaults; [`build`](Self::build) checks the
/// bounds. Each setter's meaning is that of the [`GroupCommit`] getter of the same name.
#[derive(Debug, Clone, Default)]
pub struct GroupCommitBuilder {
    window: GroupCommit,
}

impl GroupCommitBuilder {
    /// See [`GroupCommit::max_wait`] (at most [`MAX_GROUP_WAIT`]).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.window.max_wait = max_wait;
        self
    }

    /// See [`GroupCommit::max_records`] (at least 1).
    pub fn max_records(mut self, max_records: usize) -> Self {
        self.window.max_records = max_records;
        self
    }

    /// See [`GroupCommit::max_bytes`] (at least 1).
    pub fn max_bytes(mut self, max_bytes: u64) -> Self {
        self.window.max_bytes = max_bytes;
        self
    }

    /// The bounds, once they hold.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] for `max_records` or `max_bytes` of zero, or `max_wait` above
    /// [`MAX_GROUP_WAIT`].
    pub fn build(self) -> Result<GroupCommit, PolicyError> {
        let window = self.window;
        if window.max_records == 0 {
            return Err(PolicyError::ZeroMaxRecords);
        }
        if window.max_bytes == 0 {
            return Err(PolicyError::ZeroMaxBytes);
        }
        if window.max_wait > MAX_GROUP_WAIT {
            return Err(PolicyError::MaxWaitTooLong {
                max_wait: window.max_wait,
                limit: MAX_GROUP_WAIT,
            });
        }
        Ok(window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_bounds_windows_are_refused_when_built() {
        assert_eq!(GroupCommit::builder().build(), Ok(GroupCommit::default()));
        assert_eq!(
            GroupCommit::builder().max_bytes(0).build(),
            Err(PolicyError::ZeroMaxBytes)
        );
        assert_eq!(
            GroupCommit::builder().max_records(0).build(),
            Err(PolicyError::ZeroMaxRecords)
        );
        let long = MAX_GROUP_WAIT + Duration::from_nanos(1);
        assert_eq!(
            GroupCommit::builder().max_wait(long).build(),
            Err(PolicyError::MaxWaitTooLong {
                max_wait: long,
                limit: MAX_GROUP_WAIT
            })
        );
        let edge = GroupCommit::builder()
            .max_wait(MAX_GROUP_WAIT)
            .max_records(1)
            .max_bytes(1)
            .build()
            .unwrap();
        assert_eq!(
            (edge.max_wait(), edge.max_records(), edge.max_bytes()),
            (MAX_GROUP_WAIT, 1, 1)
        );
    }
}
