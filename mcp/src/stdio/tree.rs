//! Every process a stdio server started, found so that stopping the server stops them all:
//! those left in its process group, its descendants by parent id, and those that carry its
//! tag in their environment, which is how a grandchild that called `setsid` (a new session
//! and group) and was orphaned (its parent id now 1) is still found.
//!
//! The tag is an environment variable set on the server's command, `PSYCH_MCP_<pid>_<n>`
//! (this process's id and a counter), which every descendant inherits unless it clears its
//! environment. Jenkins' ProcessTreeKiller finds a build's processes the same way.
//! Chosen over `PR_SET_CHILD_SUBREAPER`: that one is process-wide (a library must not set
//! it), and reaping adopted orphans means `waitpid(-1)`, which would steal the exit status
//! of every child tokio waits for. cgroups would be exact but need privileges a user's
//! agent does not have.
//!
//! # What a look through `/proc` reads
//!
//! The server's [`Leader`] is its pid and its start time (field 22 of `/proc/<pid>/stat`),
//! read at spawn, before the pid can be reused. A look reads the owner of each
//! `/proc/<pid>` and the `stat` of the processes of this process's user only (reading a
//! `stat` takes no lock its process can hold), and considers only those that started no
//! earlier than the leader: nothing older can be of its tree. Of those, the group and
//! parent checks hold only while the pid is still the leader's (no process with its pid
//! and another start time), so a reused pid is never taken for the server. Only then is an
//! `environ` read for the tag, and never a process in state `D`: reading `environ` takes
//! the process's memory lock, which one stuck in uninterruptible sleep may hold for good.
//! Such a process that may be the tree's (orphaned to pid 1, or a found one's child: a
//! tagged grandchild that called `setsid`, perhaps still loading its program) keeps
//! [`stop`] looking a little longer ([`UNREAD_ROUNDS`]) rather than taken for none left.
//! An orphan adopted by a subreaper (`systemd --user`, `tini -s`) rather than pid 1 is
//! not counted so: only found once out of `D`.
//!
//! # Blocking
//!
//! Everything here reads `/proc` and blocks its thread. The callers run a look on a thread
//! of its own ([`bounded`], [`bounded_blocking`]) and wait for it at most a deadline, so
//! that a read that blocks anyway (a process that entered `D` after its `stat` was read)
//! holds up neither an async worker nor the server's stop; an abandoned thread ends when
//! its read does, or with the process. A dedicated thread rather than `spawn_blocking`:
//! tokio's runtime waits for its blocking tasks when it is dropped. Off Linux (no `/proc`)
//! only the process group is found.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// How many times [`stop`] looks again for processes to kill (one forking while it kills is
/// found on the next look).
const ROUNDS: usize = 50;
/// The pause between two looks.
const ROUND_PAUSE: Duration = Duration::from_millis(10);
/// How many more looks [`stop`] takes when nothing was found but a process that may be the
/// tree's could not be told ([`Look::unread`]): about 100 ms.
const UNREAD_ROUNDS: usize = 10;
/// How long a caller waits for [`signal`] or [`stop`] on their thread before going on
/// without them: [`ROUNDS`] pauses and looks take well under a second; a look stuck on a
/// process's memory lock is abandoned.
pub(crate) const DEADLINE: Duration = Duration::from_secs(5);
/// How long [`Drop`] of a server waits for its [`sweep`]: one look, no pause.
pub(crate) const SWEEP_DEADLINE: Duration = Duration::from_secs(1);

/// The environment variable that marks one server's processes.
#[derive(Debug, Clone)]
pub(crate) struct Tag {
    name: String,
}

impl Tag {
    /// A tag no other server of this process has.
    pub(crate) fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self {
            name: format!("PSYCH_MCP_{}_{n}", std::process::id()),
        }
    }

    /// The variable's name (its value is the server's name, for a person reading `ps e`).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn in_environ(&self, environ: &[u8]) -> bool {
        environ.split(|&b| b == 0).any(|entry| {
            entry
                .strip_prefix(self.name.as_bytes())
                .is_some_and(|rest| rest.first() == Some(&b'='))
        })
    }
}

/// A server's process as it was spawned: its pid (also its process group's id) and its
/// start time, which tell it from a later process given the same pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Leader {
    pid: Pid,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot); `None` off Linux.
    start: Option<u64>,
}

impl Leader {
    /// The process `pid`, just spawned and not reaped (so that the pid is still its own).
    /// Blocks for one read of its `/proc/<pid>/stat` (microseconds; it takes no lock the
    /// process can hold).
    pub(crate) fn new(pid: Pid) -> Self {
        Self {
            pid,
            start: stat(pid.as_raw()).map(|proc| proc.start),
        }
    }

    /// The pid.
    pub(crate) fn pid(self) -> Pid {
        self.pid
    }

    /// Whether the pid may still be the leader's, or its group's: no process has it with
    /// another start time. (Once the leader is reaped and its group empty, the pid can be
    /// reused; a reuse whose new process has already exited again is not seen.)
    fn pid_is_ours(self, procs: &HashMap<i32, Proc>) -> bool {
        match (procs.get(&self.pid.as_raw()), self.start) {
            (Some(proc), Some(start)) => proc.start == start,
            _ => true,
        }
    }

    /// Sends `signal` to the leader's process group, unless its pid now belongs to another
    /// process.
    fn signal_group(self, signal: Signal) {
        let reused = match (stat(self.pid.as_raw()), self.start) {
            (Some(proc), Some(start)) => proc.start != start,
            _ => false,
        };
        if !reused {
            // ESRCH (already gone) is the expected outcome for most.
            let _ = killpg(self.pid, signal);
        }
    }
}

/// One process as `/proc/<pid>/stat` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Proc {
    state: u8,
    ppid: i32,
    pgrp: i32,
    /// Field 22: the start time in clock ticks since boot.
    start: u64,
}

impl Proc {
    fn zombie(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x')
    }

    /// Whether reading its `environ` cannot block on its memory lock as far as its state
    /// tells: not in uninterruptible sleep (`D`).
    fn environ_readable(&self) -> bool {
        self.state != b'D'
    }
}

/// Reads the fields of a `/proc/<pid>/stat` line that the tree needs.
fn parse_stat(text: &str) -> Option<Proc> {
    // After the command name in parentheses (which may hold anything, `)` included):
    // state (field 3), ppid, pgrp, …, starttime (field 22).
    let (_, rest) = text.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    let start = fields.nth(22 - 6)?.parse().ok()?;
    Some(Proc {
        state,
        ppid,
        pgrp,
        start,
    })
}

fn stat(pid: i32) -> Option<Proc> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The live processes (not zombies) of `leader`'s tree: in its group, tagged with `tag`,
/// or (while its pid is still its own) descended from it; never this process, one of
/// another user, or one older than the leader. Blocks: reads `/proc` (see the module docs
/// for what, and for the one read that may block for long).
pub(crate) fn members(leader: Leader, tag: &Tag) -> Vec<Pid> {
    look(leader, tag).found
}

/// What one look through `/proc` found.
#[derive(Debug, Default)]
pub(crate) struct Look {
    /// The tree's live processes ([`members`]).
    pub(crate) found: Vec<Pid>,
    /// Processes that may be the tree's but could not be told: in state `D` (their
    /// `environ` is not read), not found otherwise, and orphaned (parent 1) or children of
    /// a found one, as a tagged grandchild that called `setsid` is. A look that leaves
    /// some is not taken for "none left" while [`stop`] may look again.
    pub(crate) unread: usize,
}

/// One look: [`members`], and how many processes could not be told.
fn look(leader: Leader, tag: &Tag) -> Look {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Look::default();
    };
    // Without the leader's start time a pid cannot be told from a reused one.
    let Some(leader_start) = leader.start else {
        return Look::default();
    };
    let Ok(uid) = std::fs::metadata("/proc/self").map(|meta| meta.uid()) else {
        return Look::default();
    };
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let mut procs = HashMap::new();
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // The owner of `/proc/<pid>` is the process's effective user.
        if pid == me || entry.metadata().map(|meta| meta.uid()).ok() != Some(uid) {
            continue;
        }
        if let Some(proc) = stat(pid) {
            procs.insert(pid, proc);
        }
    }
    let ours = leader.pid_is_ours(&procs);
    let leader = leader.pid.as_raw();
    let descends = |mut pid: i32| {
        // Bounded: a parent chain longer than the table is a loop of reused ids.
        for _ in 0..procs.len() {
            if pid == leader {
                return true;
            }
            match procs.get(&pid) {
                Some(proc) if proc.ppid > 1 => pid = proc.ppid,
                _ => return false,
            }
        }
        false
    };
    let mut unknown: Vec<Proc> = Vec::new();
    let mut found: Vec<Pid> = procs
        .iter()
        .filter(|(_, proc)| !proc.zombie() && proc.start >= leader_start)
        .filter(|&(&pid, proc)| {
            if ours && (proc.pgrp == leader || descends(pid)) {
                return true;
            }
            if !proc.environ_readable() {
                unknown.push(*proc);
                return false;
            }
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|environ| tag.in_environ(&environ))
        })
        .map(|(&pid, _)| Pid::from_raw(pid))
        .collect();
    found.sort();
    let unread = unread(&unknown, &found);
    Look { found, unread }
}

/// Of `unknown` (processes in state `D`, not found otherwise), those that may be of the
/// tree: orphaned (parent 1) or children of one of `found` (sorted).
fn unread(unknown: &[Proc], found: &[Pid]) -> usize {
    unknown
        .iter()
        .filter(|proc| proc.ppid == 1 || found.binary_search(&Pid::from_raw(proc.ppid)).is_ok())
        .count()
}

/// Sends `signal` to `leader`'s group and to every process of its tree. Blocks (reads
/// `/proc`): run it through [`bounded`].
pub(crate) fn signal(leader: Leader, tag: &Tag, signal: Signal) {
    leader.signal_group(signal);
    for pid in members(leader, tag) {
        let _ = kill(pid, signal);
    }
}

/// Kills (SIGKILL) `leader`'s group and every process of its tree, looking again until none
/// is left (or [`ROUNDS`] looks) and none could not be told (or [`UNREAD_ROUNDS`] more
/// looks: time for a process to finish loading its program, not for one stuck in `D`,
/// which is then left); says whether none is left. Blocks (reads `/proc`, pauses): run it
/// through [`bounded`].
pub(crate) fn stop(leader: Leader, tag: &Tag) -> bool {
    let mut unread_rounds = 0;
    for _ in 0..ROUNDS {
        let left = kill_found(leader, tag);
        if left.found.is_empty() {
            if left.unread == 0 || unread_rounds >= UNREAD_ROUNDS {
                return true;
            }
            unread_rounds += 1;
        }
        std::thread::sleep(ROUND_PAUSE);
    }
    members(leader, tag).is_empty()
}

/// Kills (SIGKILL) `leader`'s group and every process of its tree found in one look, with
/// no pause: what a server dropped without being stopped gets at once. Says whether the
/// look found none and left none it could not tell ([`Look::unread`]). Blocks (reads
/// `/proc` once): run it through [`bounded_blocking`].
pub(crate) fn sweep(leader: Leader, tag: &Tag) -> bool {
    let left = kill_found(leader, tag);
    left.found.is_empty() && left.unread == 0
}

/// Kills `leader`'s group, then looks once and kills what the look found.
fn kill_found(leader: Leader, tag: &Tag) -> Look {
    leader.signal_group(Signal::SIGKILL);
    let left = look(leader, tag);
    for &pid in &left.found {
        let _ = kill(pid, Signal::SIGKILL);
    }
    left
}

/// Runs `work` on a thread of its own, and sends its result on `done`.
fn spawn<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
    done: impl FnOnce(T) + Send + 'static,
) -> bool {
    detach(move || done(work()))
}

/// Runs blocking `work` on a thread of its own, not waited for; says whether the thread
/// started.
pub(crate) fn detach(work: impl FnOnce() + Send + 'static) -> bool {
    std::thread::Builder::new()
        .name("psych-mcp-tree".into())
        .spawn(work)
        .is_ok()
}

/// Runs blocking `work` on a thread of its own and waits for it at most `deadline`,
/// without blocking the async worker; `None` if it did not finish by then (the thread is
/// left to finish alone) or could not be started.
pub(crate) async fn bounded<T: Send + 'static>(
    deadline: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if !spawn(work, move |result| drop(tx.send(result))) {
        return None;
    }
    tokio::time::timeout(deadline, rx).await.ok()?.ok()
}

/// Runs blocking `work` on a thread of its own and blocks this thread until it finishes,
/// at most `deadline`; `None` if it did not finish by then (the thread is left to finish
/// alone) or could not be started.
pub(crate) fn bounded_blocking<T: Send + 'static>(
    deadline: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    if !spawn(work, move |result| drop(tx.send(result))) {
        return None;
    }
    rx.recv_timeout(deadline).ok()
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "a test fails loudly on bad data"
    )]

    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command, Stdio};

    use super::*;

    #[test]
    fn a_tag_matches_its_own_variable_only() {
        let tag = Tag {
            name: "PSYCH_MCP_1_2".into(),
        };
        assert!(tag.in_environ(b"A=1\0PSYCH_MCP_1_2=fs\0B=2\0"));
        assert!(tag.in_environ(b"PSYCH_MCP_1_2=\0"));
        assert!(!tag.in_environ(b"PSYCH_MCP_1_23=fs\0X_PSYCH_MCP_1_2=y\0"));
        assert!(!tag.in_environ(b"A=PSYCH_MCP_1_2=fs\0"));
        assert_ne!(Tag::new().name(), Tag::new().name());
    }

    #[test]
    fn this_process_is_never_a_member() {
        let me = Leader::new(Pid::from_raw(i32::try_from(std::process::id()).unwrap()));
        assert!(!members(me, &Tag::new()).contains(&me.pid()));
    }

    #[test]
    fn stat_fields_are_read_after_the_last_parenthesis() {
        let line = "4242 (a) (b) 1 2) D 17 4242 4242 0 -1 4194560 107 0 0 0 0 0 0 0 20 0 1 0 \
                    987654 2273280 288 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1";
        assert_eq!(
            parse_stat(line),
            Some(Proc {
                state: b'D',
                ppid: 17,
                pgrp: 4242,
                start: 987_654
            })
        );
        assert!(!parse_stat(line).unwrap().environ_readable());
        assert_eq!(parse_stat("1 (x) S 0 1"), None);
        let me = stat(i32::try_from(std::process::id()).unwrap()).unwrap();
        assert!(me.environ_readable() && !me.zombie() && me.start > 0);
    }

    /// `sleep 1000` in a process group of its own, with `tag` in its environment if given.
    fn sleeper(tag: Option<&Tag>) -> Child {
        let mut command = Command::new("sleep");
        command.arg("1000").stdin(Stdio::null()).process_group(0);
        if let Some(tag) = tag {
            command.env(tag.name(), "test");
        }
        command.spawn().unwrap()
    }

    fn pid(child: &Child) -> Pid {
        Pid::from_raw(i32::try_from(child.id()).unwrap())
    }

    fn end(mut children: Vec<Child>) {
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Review item 1: a process that carries the tag but started before the server is not
    /// of its tree (a tag of an earlier psych process with the same pid), nor is one of
    /// another user; one that started after is.
    #[test]
    fn only_processes_started_after_the_leader_by_this_user_are_members() {
        let tag = Tag::new();
        let early = sleeper(Some(&tag));
        let early_start = stat(pid(&early).as_raw()).unwrap().start;
        // A leader that started at least one clock tick after `early`.
        let leader = loop {
            let leader = sleeper(None);
            if Leader::new(pid(&leader)).start > Some(early_start) {
                break leader;
            }
            end(vec![leader]);
            std::thread::sleep(Duration::from_millis(5));
        };
        let info = Leader::new(pid(&leader));
        let late = sleeper(Some(&tag));
        let mut children = vec![early, leader, late];
        let mut want = vec![pid(&children[1]), pid(&children[2])];
        want.sort();
        // Root can start a tagged process as another user; it is not ours to kill.
        if std::fs::metadata("/proc/self").unwrap().uid() == 0 {
            let mut command = Command::new("sleep");
            command
                .arg("1000")
                .env(tag.name(), "test")
                .process_group(0)
                .uid(65_534);
            children.push(command.spawn().unwrap());
        }
        // A process is read only out of uninterruptible sleep (`environ_readable`); on a
        // loaded machine `late` can still be in `D` loading `sleep` when the scan comes,
        // and is then rightly skipped. The test is about start times and users: it scans
        // once `late` is asleep in `sleep` itself.
        let asleep = |child: &Child| {
            for _ in 0..10_000 {
                if stat(pid(child).as_raw()).is_some_and(|proc| proc.state == b'S') {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            panic!("{} never went to sleep", child.id());
        };
        asleep(&children[2]);
        assert_eq!(members(info, &tag), want);
        end(children);
    }

    /// Review item 1: once the leader's pid belongs to another process (another start
    /// time), its group and its descendants are not taken for the server's.
    #[test]
    fn a_reused_leader_pid_is_not_taken_for_the_server() {
        let other = sleeper(None);
        let real = Leader::new(pid(&other));
        assert_eq!(members(real, &Tag::new()), [pid(&other)], "its own group");
        let before = Leader {
            pid: real.pid,
            start: real.start.map(|start| start - 1),
        };
        assert_eq!(members(before, &Tag::new()), []);
        end(vec![other]);
    }

    #[test]
    fn a_stop_kills_the_group_and_the_tagged_processes() {
        let tag = Tag::new();
        let leader = sleeper(None);
        let info = Leader::new(pid(&leader));
        let tagged = sleeper(Some(&tag));
        // `tagged` is this test's child, not orphaned nor the tree's: while still in `D`
        // loading `sleep` it could not be told, and a stop would rightly not wait for it
        // (see `unread`). The test is about killing what is found: it stops once `tagged`
        // is asleep in `sleep` itself.
        for _ in 0..10_000 {
            if stat(pid(&tagged).as_raw()).is_some_and(|proc| proc.state == b'S') {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(stop(info, &tag));
        for mut child in [leader, tagged] {
            assert!(child.wait().unwrap().code().is_none(), "killed");
        }
    }

    /// A process in `D` counts as one a look could not tell when it is orphaned or a found
    /// one's child (a tagged grandchild that called `setsid`), not otherwise (another
    /// program of the user).
    #[test]
    fn a_process_in_d_keeps_a_stop_looking_only_if_it_may_be_the_trees() {
        let proc = |ppid| Proc {
            state: b'D',
            ppid,
            pgrp: 4000,
            start: 10,
        };
        let found = [Pid::from_raw(300), Pid::from_raw(301)];
        assert_eq!(unread(&[proc(1), proc(301), proc(77)], &found), 2);
        assert_eq!(unread(&[proc(77)], &found), 0);
        assert_eq!(unread(&[], &found), 0);
    }

    /// Review item 1: a look that blocks is abandoned at its deadline.
    #[tokio::test]
    async fn a_stuck_look_is_abandoned_at_its_deadline() {
        let stuck = || loop {
            std::thread::park();
        };
        assert_eq!(bounded(Duration::from_millis(50), stuck).await, None::<()>);
        assert_eq!(
            bounded_blocking(Duration::from_millis(50), stuck),
            None::<()>
        );
        assert_eq!(bounded(DEADLINE, || 7).await, Some(7));
        assert_eq!(bounded_blocking(DEADLINE, || 8), Some(8));
    }
}
