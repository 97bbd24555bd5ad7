//! Workspace automation, reached as `cargo xtask <command>`.
//!
//! - `cargo xtask ci`: everything CI checks, in order, stopping at the first failure: tidy
//!   checks, `cargo fmt --check`, clippy with warnings denied, `cargo xtask package`,
//!   rustdoc with warnings denied, then the unit, integration and doc tests (with insta
//!   refusing to write or accept snapshots) and a look for pending snapshots.
//! - `cargo xtask tidy`: the tidy checks alone.
//! - `cargo xtask package`: every published crate packaged as crates.io would receive it
//!   (nothing is uploaded), each package's file list checked and its sources compiled from
//!   the package (see `package.rs`). Part of `ci`.
//! - `cargo xtask sync-readmes`: rewrites the example of each published crate's README from
//!   the `# Example` of its `lib.rs` (tidy refuses a README whose example differs).
//! - `cargo xtask preserve-order`: the tests of `xtask/preserve-order-check`, a build of
//!   psych-types with serde_json's `preserve_order` on (which tidy refuses in the workspace),
//!   in its own workspace and target folder: the JSON text view must be the same bytes there.
//!   Part of `ci`.
//! - `cargo xtask sdk-check` (optional, not part of `ci`; needs `python3` and PyPI): validates
//!   every request body in the prompt snapshots with the official SDKs' request types (the
//!   Python `anthropic` and `openai` packages' typed dictionaries, through pydantic's
//!   `TypeAdapter`), in a virtual environment it makes once in `target/sdk-venv`. The script is
//!   `xtask/sdk-check/check.py`.
//! - `cargo xtask clients` (needs `python3`, `npm`, PyPI and the npm registry): installs the
//!   real MCP clients that `cli/tests/serve_clients.rs` drives `psych serve` with: the Python
//!   SDK (`mcp==2.3.0`) in a virtual environment in `target/mcp-venv`, and the TypeScript SDK
//!   by `npm ci` in `tests/clients/ts` (from its committed `package-lock.json`). Each is
//!   skipped when what it would install is already there, so a second run is quick. `.ci/run`
//!   runs it before `ci`.
//! - `cargo xtask bench [PACKAGE…]` (not part of `ci`): every crate's criterion benches with
//!   short settings, then one markdown report, `target/bench-report.md`, with each figure as
//!   a ratio to its group's baseline.

#![forbid(unsafe_code)]

mod bench;
mod package;
mod readme;
mod tidy;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};
use std::time::Instant;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(&root),
        Some("tidy") => tidy_step(&root),
        Some("package") => package::package(&root),
        Some("sync-readmes") => sync_readmes(&root),
        Some("preserve-order") => preserve_order(&root),
        Some("sdk-check") => sdk_check(&root),
        Some("clients") => clients(&root),
        Some("bench") => bench::bench(&root, &args[1..]),
        _ => Err(
            "usage: cargo xtask <ci|tidy|package|sync-readmes|preserve-order|sdk-check|clients|\
             bench [PACKAGE…]>"
                .to_owned(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root: the parent of this crate's folder.
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn ci(root: &Path) -> Result<(), String> {
    let started = Instant::now();
    tidy_step(root)?;
    cargo(root, &["fmt", "--all", "--check"], &[])?;
    cargo(
        root,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )?;
    // After clippy, which has checked every dependency the packages' checks need.
    package::package(root)?;
    cargo(
        root,
        &["doc", "--no-deps", "--workspace", "--locked"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    preserve_order(root)?;
    // Unit, integration and doc tests, last so that a run ends with their summary. insta
    // must never write or accept a snapshot here: a changed or missing one is a failure.
    let insta = [("INSTA_UPDATE", "no"), ("INSTA_FORCE_PASS", "0")];
    eprintln!(
        "xtask: checks before the tests took {:.0?}",
        started.elapsed()
    );
    let tests = cargo(root, &["test", "--workspace", "--locked"], &insta);
    pending_snapshots(root)?;
    // Nothing is printed after a passing test run: CI output ends with its summary.
    tests
}

/// Tests psych-types built with serde_json's `preserve_order` on, apart from the workspace.
fn preserve_order(root: &Path) -> Result<(), String> {
    let manifest = root.join("xtask/preserve-order-check/Cargo.toml");
    let target = root.join("target/preserve-order");
    cargo(
        root,
        &[
            "test",
            "--quiet",
            "--locked",
            "--manifest-path",
            &manifest.to_string_lossy(),
            "--target-dir",
            &target.to_string_lossy(),
        ],
        &[],
    )
}

/// Runs `program args` in the workspace, failing on a non-zero exit.
fn run(root: &Path, program: &Path, args: &[&str]) -> Result<(), String> {
    eprintln!("xtask: {} {}", program.display(), args.join(" "));
    let status = Command::new(program)
        .args(args)
        .current_dir(root)
        .status()
        .map_err(|err| format!("cannot run {}: {err}", program.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} {} failed ({status})",
            program.display(),
            args.join(" ")
        ))
    }
}

/// Validates the snapshot request bodies with the official SDKs' request types.
fn sdk_check(root: &Path) -> Result<(), String> {
    let venv = root.join("target/sdk-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        run(
            root,
            Path::new("python3"),
            &["-m", "venv", &venv.to_string_lossy()],
        )?;
        run(
            root,
            &python,
            &["-m", "pip", "install", "--quiet", "anthropic", "openai"],
        )?;
    }
    run(
        root,
        &python,
        &[
            "xtask/sdk-check/check.py",
            "tests/tests/snapshots",
            "prompt-assembly/tests/snapshots",
        ],
    )
}

/// The Python SDK the client tests pin, as pip takes it.
const PYTHON_MCP: &str = "mcp==2.3.0";

/// Installs the real MCP clients of `cli/tests/serve_clients.rs`: `PYTHON_MCP` in
/// `target/mcp-venv`, and `tests/clients/ts`'s locked packages. Each install leaves a stamp
/// (the requirement; a copy of the lock file) and is skipped while the stamp matches.
fn clients(root: &Path) -> Result<(), String> {
    let venv = root.join("target/mcp-venv");
    let python = venv.join("bin/python");
    let stamp = venv.join("xtask-installed");
    if python.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(PYTHON_MCP) {
        eprintln!("xtask: {PYTHON_MCP} is installed in {}", venv.display());
    } else {
        run(
            root,
            Path::new("python3"),
            &["-m", "venv", "--clear", &venv.to_string_lossy()],
        )?;
        run(
            root,
            &python,
            &[
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                PYTHON_MCP,
            ],
        )?;
        write_stamp(&stamp, PYTHON_MCP.as_bytes())?;
    }

    let ts = root.join("tests/clients/ts");
    let lock = std::fs::read(ts.join("package-lock.json"))
        .map_err(|err| format!("cannot read tests/clients/ts/package-lock.json: {err}"))?;
    let stamp = ts.join("node_modules/.xtask-installed-lock.json");
    if std::fs::read(&stamp).ok().as_deref() == Some(lock.as_slice()) {
        eprintln!("xtask: tests/clients/ts/node_modules matches its package-lock.json");
    } else {
        run(
            root,
            Path::new("npm"),
            &[
                "ci",
                "--prefix",
                "tests/clients/ts",
                "--no-audit",
                "--no-fund",
            ],
        )?;
        write_stamp(&stamp, &lock)?;
    }
    Ok(())
}

fn write_stamp(path: &Path, contents: &[u8]) -> Result<(), String> {
    std::fs::write(path, contents).map_err(|err| format!("cannot write {}: {err}", path.display()))
}

/// Rewrites each published crate's README example from its `lib.rs` example.
fn sync_readmes(root: &Path) -> Result<(), String> {
    let metadata = tidy::cargo_metadata(root)?;
    for krate in tidy::published(&metadata) {
        let (lib, readme) = (krate.dir.join("src/lib.rs"), krate.dir.join("README.md"));
        let (Ok(lib_rs), Ok(text)) = (
            std::fs::read_to_string(&lib),
            std::fs::read_to_string(&readme),
        ) else {
            continue;
        };
        if let Some(new) = readme::synced(&lib_rs, &text) {
            std::fs::write(&readme, new)
                .map_err(|err| format!("cannot write {}: {err}", readme.display()))?;
            eprintln!("xtask: rewrote the example of {}", readme.display());
        }
    }
    Ok(())
}

fn tidy_step(root: &Path) -> Result<(), String> {
    eprintln!("xtask: tidy checks");
    let violations = tidy::run_all(root)?;
    if violations.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} tidy violation(s):\n  {}",
            violations.len(),
            violations.join("\n  ")
        ))
    }
}

/// Fails if insta left a pending snapshot anywhere in the tree.
fn pending_snapshots(root: &Path) -> Result<(), String> {
    let mut pending = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir)
            .map_err(|err| format!("cannot list {}: {err}", dir.display()))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if name.ends_with(".snap.new") || name.ends_with(".pending-snap") {
                pending.push(path.display().to_string());
            }
        }
    }
    if pending.is_empty() {
        Ok(())
    } else {
        Err(format!("pending insta snapshots: {}", pending.join(", ")))
    }
}

/// Runs `cargo <args>` in the workspace with extra environment, failing on a non-zero exit.
fn cargo(root: &Path, args: &[&str], envs: &[(&str, &str)]) -> Result<(), String> {
    let status = cargo_command(root, args)
        .envs(envs.iter().copied())
        .status()
        .map_err(|err| format!("cannot run cargo {}: {err}", args.join(" ")))?;
    cargo_exit(args, status)
}

/// `cargo <args>` in the workspace (the cargo running xtask, else `cargo`), announced on
/// stderr.
fn cargo_command(root: &Path, args: &[&str]) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("xtask: cargo {}", args.join(" "));
    let mut command = Command::new(cargo);
    command.args(args).current_dir(root);
    command
}

/// Whether `cargo <args>`, which exited with `status`, succeeded.
fn cargo_exit(args: &[&str], status: ExitStatus) -> Result<(), String> {
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo {} failed ({status})", args.join(" ")))
    }
}
