//! A text larger than memory should hold, for the stores' size tests: numbered lines of
//! [`LINE_LEN`] bytes and one last line found nowhere else, written to a temporary file,
//! and the process's peak resident memory to bound what storing it cost.

use std::io::{BufWriter, Write as _};

/// The last line of a [`text_file`], found nowhere else in it.
pub const LAST: &str = "the one last line: 7f3a-unique\n";

/// The length of every line but the last.
pub const LINE_LEN: u64 = 64;

/// Line `n` before the last: 64 bytes, its number in bytes 5..17.
const LINE: &[u8; 64] = b"line 000000000000 the quick brown fox jumps over the lazy dogs.\n";

/// A text of about `target` bytes (whole lines) in an unnamed temporary file: the file,
/// its length, and how many numbered lines come before [`LAST`] (the last line's number,
/// counting from 0).
///
/// # Panics
///
/// When the temporary file cannot be written (a test fixture).
pub fn text_file(target: u64) -> (std::fs::File, u64, u64) {
    let lines = (target - LAST.len() as u64) / LINE_LEN;
    let file = tempfile::tempfile().unwrap_or_else(|e| panic!("a temporary file: {e}"));
    let mut out = BufWriter::with_capacity(1 << 20, &file);
    let mut line = *LINE;
    for n in 0..lines {
        let mut rest = n;
        for digit in line[5..17].iter_mut().rev() {
            *digit = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        out.write_all(&line)
            .unwrap_or_else(|e| panic!("writing the text: {e}"));
    }
    out.write_all(LAST.as_bytes())
        .and_then(|()| out.flush())
        .unwrap_or_else(|e| panic!("writing the text: {e}"));
    drop(out);
    (file, lines * LINE_LEN + LAST.len() as u64, lines)
}

/// A tool result whose one text block is a [`text_file`] of about `target` bytes, spilled
/// (held by the file, not in memory), as a transport hands a result too large for memory
/// to a store: the output, the text's length and its numbered lines (as [`text_file`]).
pub fn spilled_output(target: u64) -> (psych_types::ToolOutput, u64, u64) {
    use psych_types::{ContentBlock, SpilledBlock, SpilledText, ToolOutput};
    let (file, len, lines) = text_file(target);
    let text = std::sync::Arc::new(SpilledText::new(file, len));
    let output = ToolOutput {
        spilled: vec![SpilledBlock {
            block: 0,
            text: std::sync::Arc::clone(&text),
        }],
        ..ToolOutput::from_blocks(vec![ContentBlock::text(text.placeholder())])
    };
    (output, len, lines)
}

/// A tool result record of the call `call_id` to tool `name` with `output`, reaching no
/// remote tool: what the size tests append.
///
/// # Panics
///
/// When `call_id` is not a valid call id.
pub fn tool_result(
    call_id: &str,
    name: &str,
    output: psych_types::ToolOutput,
) -> psych_types::Record {
    psych_types::Record::ToolResult(psych_types::ToolResult {
        target: None,
        call_id: psych_types::ToolCallId::new(call_id)
            .unwrap_or_else(|e| panic!("call id {call_id:?}: {e}")),
        name: name.into(),
        output,
    })
}

/// The peak resident set of this process so far, in bytes (`VmHWM` of
/// `/proc/self/status`).
///
/// # Panics
///
/// Where `/proc/self/status` has no `VmHWM` (not Linux).
pub fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_else(|e| panic!("/proc/self/status: {e}"));
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in /proc/self/status"));
    kib * 1024
}

/// Runs test `test` of this test binary again in a child process with `key=value` in its
/// environment (the child sees it and does the reads to measure, then calls
/// [`print_peak`]), prints the child's peak resident set (the reads' alone, without what
/// the parent built to store) and asserts that it stays under `limit` bytes.
///
/// # Panics
///
/// When the child cannot start, fails, prints no peak, or peaks at `limit` or more.
pub fn assert_child_peak_under(
    test: &str,
    key: &str,
    value: impl AsRef<std::ffi::OsStr>,
    limit: u64,
) {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("this test binary: {e}"));
    let child = std::process::Command::new(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(key, value)
        .output()
        .unwrap_or_else(|e| panic!("the child: {e}"));
    let stdout = String::from_utf8_lossy(&child.stdout);
    assert!(
        child.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&child.stderr)
    );
    // The harness prints the test's name on the line the child's `peak N` ends.
    let peak: u64 = stdout
        .split("peak ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no peak in {stdout}"));
    eprintln!(
        "{test}: the reading child's peak RSS was {} MiB",
        peak >> 20
    );
    assert!(
        peak < limit,
        "peak {} MiB, over {} MiB",
        peak >> 20,
        limit >> 20
    );
}

/// In the child of [`assert_child_peak_under`]: prints this process's peak for the parent.
pub fn print_peak() {
    println!("peak {}", peak_rss());
}

/// Asserts that `source` reads the end of [`text_file`]`(…)`'s text, stored under `handle`
/// (`len` bytes, `lines` numbered lines before [`LAST`]): its length, its last bytes by
/// offset, and its last line by line mark, the mark within a stride (512 KiB for 1 GiB)
/// before it.
///
/// # Panics
///
/// When a read fails or reads otherwise (a test's assertion).
pub fn assert_end_reads<S>(source: &S, handle: &psych_types::RecordHandle, len: u64, lines: u64)
where
    S: psych_types::RecordSource,
    S::Error: std::fmt::Debug,
{
    let info = source
        .output_info(handle)
        .unwrap_or_else(|e| panic!("{e:?}"))
        .unwrap_or_else(|| panic!("a result under {handle}"));
    assert_eq!(info.len, len);
    let mut tail = vec![0u8; LAST.len()];
    let n = source
        .read_output(handle, len - LAST.len() as u64, &mut tail)
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(&tail[..n], LAST.as_bytes());
    let mark = source
        .line_mark(handle, lines)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let last_start = lines * LINE_LEN;
    assert!(
        mark.at <= last_start && last_start - mark.at <= 512 << 10,
        "{mark:?}"
    );
    assert_eq!(mark.breaks_before, mark.at / LINE_LEN);
    let mut page = vec![0u8; usize::try_from(last_start - mark.at).unwrap_or(0) + LAST.len()];
    let n = source
        .read_output(handle, mark.at, &mut page)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let page = std::str::from_utf8(&page[..n]).unwrap_or_else(|e| panic!("{e}"));
    let found = page
        .split_inclusive('\n')
        .nth(usize::try_from(lines - mark.breaks_before).unwrap_or(usize::MAX));
    assert_eq!(found, Some(LAST));
}
