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
//! Everything here reads `/proc` and blocks its thread: async callers use
//! `spawn_blocking`. Off Linux (no `/proc`) only the process group is found.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// How many times [`stop`] looks again for processes to kill (one forking while it kills is
/// found on the next look).
const ROUNDS: usize = 50;
/// The pause between two looks.
const ROUND_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

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

/// One process as `/proc/<pid>/stat` describes it.
struct Proc {
    ppid: i32,
    pgrp: i32,
    zombie: bool,
}

fn stat(pid: i32) -> Option<Proc> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name in parentheses: state, ppid, pgrp, …
    let (_, rest) = text.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(Proc {
        ppid,
        pgrp,
        zombie: state == "Z" || state == "X",
    })
}

/// The live processes (not zombies) of `leader`'s tree: in its group, tagged with `tag`,
/// or (while the leader has not been reaped, so that its id cannot have been reused)
/// descended from it. Never this process.
pub(crate) fn members(leader: Pid, tag: &Tag, leader_alive: bool) -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let mut procs = HashMap::new();
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Some(proc) = stat(pid) {
            procs.insert(pid, proc);
        }
    }
    let leader = leader.as_raw();
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
    let mut found: Vec<Pid> = procs
        .iter()
        .filter(|(_, proc)| !proc.zombie)
        .filter(|&(&pid, proc)| {
            proc.pgrp == leader
                || (leader_alive && descends(pid))
                || std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|environ| tag.in_environ(&environ))
        })
        .map(|(&pid, _)| Pid::from_raw(pid))
        .collect();
    found.sort();
    found
}

/// Sends `signal` to `leader`'s group and to every process of its tree. Blocks (reads
/// `/proc`).
pub(crate) fn signal(leader: Pid, tag: &Tag, leader_alive: bool, signal: Signal) {
    // ESRCH (already gone) is the expected outcome for most.
    let _ = killpg(leader, signal);
    for pid in members(leader, tag, leader_alive) {
        let _ = kill(pid, signal);
    }
}

/// Kills (SIGKILL) `leader`'s group and every process of its tree, looking again until none
/// is left (or [`ROUNDS`] looks); says whether none is. Blocks (reads `/proc`, pauses).
/// Call it once the leader has been reaped (its descendants are then found by group and
/// tag).
pub(crate) fn stop(leader: Pid, tag: &Tag) -> bool {
    for _ in 0..ROUNDS {
        let _ = killpg(leader, Signal::SIGKILL);
        let left = members(leader, tag, false);
        if left.is_empty() {
            return true;
        }
        for pid in left {
            let _ = kill(pid, Signal::SIGKILL);
        }
        std::thread::sleep(ROUND_PAUSE);
    }
    members(leader, tag, false).is_empty()
}

#[cfg(test)]
mod tests {
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
        let me = Pid::from_raw(i32::try_from(std::process::id()).unwrap_or(0));
        assert!(!members(me, &Tag::new(), true).contains(&me));
    }
}
