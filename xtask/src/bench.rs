//! `cargo xtask bench [PACKAGE…]`: runs every crate's criterion benchmarks with short
//! settings and writes one markdown report, each figure as a ratio to its group's baseline.
//!
//! Every bench group in this workspace compares Psych's code against a baseline side by
//! side. The baseline of a group is its figure whose id names one ([`BASELINE_MARKS`]:
//! `baseline`, `bare_`, `serde_json`, `memmem`, `rmcp_direct`, `redb`, `u64_word_sum`,
//! `per_append_fsync`, `clone_`; the first in id order when several do); a group with none
//! is compared to its fastest figure. Only figures written by this run are reported
//! (criterion's `new/estimates.json` newer than the start). A figure that is not a time (a
//! file's size, how many groups a commit formed) is printed by its bench on a line starting
//! with [`PRINTED_MARK`]; those lines are kept in the report as printed. The report is
//! `target/bench-report.md` (under `CARGO_TARGET_DIR` when it is set).

use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::SystemTime;

/// How a bench's output line starts when it states a figure that is not a time.
const PRINTED_MARK: &str = "figure: ";

/// Substrings that mark a figure as its group's baseline.
const BASELINE_MARKS: [&str; 9] = [
    "baseline",
    "bare_",
    "serde_json",
    "memmem",
    "rmcp_direct",
    "redb",
    "u64_word_sum",
    "per_append_fsync",
    "clone_",
];

/// One measured figure.
struct Figure {
    group: String,
    id: String,
    mean_ns: f64,
}

/// Runs the benches of `packages` (every package with a `[[bench]]` when empty) and writes
/// `target/bench-report.md`.
pub(crate) fn bench(root: &Path, packages: &[String]) -> Result<(), String> {
    let all = bench_targets(root)?;
    let chosen: Vec<&BenchPackage> = if packages.is_empty() {
        all.iter().collect()
    } else {
        let mut chosen = Vec::new();
        for name in packages {
            let package = all
                .iter()
                .find(|p| &p.name == name)
                .ok_or_else(|| format!("{name} is not a workspace package with benches"))?;
            chosen.push(package);
        }
        chosen
    };
    // Every run selects every bench package, so cargo resolves their features once, as for
    // one build: selecting one package at a time would rebuild shared dependencies (rmcp,
    // tokio) with that package's features, again for each package.
    let selection: Vec<&str> = all.iter().flat_map(|p| ["-p", p.name.as_str()]).collect();
    let started = SystemTime::now();
    // One package failing (a bench that panics, a build error) must not cost the figures of
    // the others: each runs, failures are listed in the report and make the command fail.
    let mut failed = Vec::new();
    let mut printed = Vec::new();
    for package in &chosen {
        let run = bench_package(root, &selection, package, &mut printed);
        if let Err(e) = run {
            eprintln!("xtask: {e}");
            failed.push(format!("{}: {e}", package.name));
        }
    }
    let packages: Vec<String> = chosen.iter().map(|p| p.name.clone()).collect();
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let mut figures = Vec::new();
    collect(&target.join("criterion"), started, &mut figures)?;
    figures.sort_by(|a, b| (&a.group, &a.id).cmp(&(&b.group, &b.id)));
    let report = render(&packages, &figures, &printed, &failed);
    let path = target.join("bench-report.md");
    std::fs::write(&path, report).map_err(|e| format!("writing {}: {e}", path.display()))?;
    eprintln!("xtask: bench report in {}", path.display());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("benches failed: {}", failed.join("; ")))
    }
}

/// Runs one package's benches (cargo selecting `selection`), echoing their output and
/// keeping each [`PRINTED_MARK`] line (without the mark) in `printed`.
fn bench_package(
    root: &Path,
    selection: &[&str],
    package: &BenchPackage,
    printed: &mut Vec<String>,
) -> Result<(), String> {
    let mut args = vec!["bench"];
    args.extend_from_slice(selection);
    // Bench targets only, by name (they are unique in the workspace: tidy would not need
    // it, cargo refuses an ambiguous `--bench`): a lib or bin target's libtest harness would
    // reject criterion's options below.
    for target in &package.benches {
        args.extend(["--bench", target.as_str()]);
    }
    args.extend(["--", "--warm-up-time", "1", "--measurement-time", "3"]);
    let mut child = crate::cargo_command(root, &args)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|err| format!("cannot run cargo {}: {err}", args.join(" ")))?;
    if let Some(stdout) = child.stdout.take() {
        let mut echo = std::io::stdout().lock();
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("reading cargo bench's output: {e}"))?;
            // The echo is for the person watching; a closed stdout must not stop the run.
            let _ = writeln!(echo, "{line}");
            printed.extend(printed_figure(&line));
        }
    }
    let status = child
        .wait()
        .map_err(|err| format!("waiting for cargo {}: {err}", args.join(" ")))?;
    crate::cargo_exit(&args, status)
}

/// The figure a bench's output line states, if it starts with [`PRINTED_MARK`].
fn printed_figure(line: &str) -> Option<String> {
    line.strip_prefix(PRINTED_MARK)
        .map(str::trim)
        .filter(|figure| !figure.is_empty())
        .map(str::to_owned)
}

/// A workspace package and its bench targets.
struct BenchPackage {
    name: String,
    benches: Vec<String>,
}

/// Workspace packages with a bench target, by name, each with its bench targets' names, from
/// `cargo metadata` (as tidy reads it).
fn bench_targets(root: &Path) -> Result<Vec<BenchPackage>, String> {
    let metadata = crate::tidy::cargo_metadata(root)?;
    let mut out: Vec<BenchPackage> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|package| {
            let mut benches: Vec<String> = package["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|target| {
                    target["kind"]
                        .as_array()
                        .is_some_and(|k| k.contains(&"bench".into()))
                })
                .filter_map(|target| target["name"].as_str().map(str::to_owned))
                .collect();
            benches.sort();
            let name = package["name"].as_str()?.to_owned();
            (!benches.is_empty()).then_some(BenchPackage { name, benches })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Every `<group>/<id…>/new/estimates.json` under `dir` written after `since`.
fn collect(dir: &Path, since: SystemTime, out: &mut Vec<Figure>) -> Result<(), String> {
    let Ok(groups) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for group in groups.filter_map(Result::ok) {
        let group_path = group.path();
        if !group_path.is_dir() || group.file_name() == "report" {
            continue;
        }
        let mut stack = vec![group_path.clone()];
        while let Some(path) = stack.pop() {
            let estimates = path.join("new/estimates.json");
            if estimates.is_file() {
                let fresh = std::fs::metadata(&estimates)
                    .and_then(|m| m.modified())
                    .is_ok_and(|modified| modified >= since);
                if fresh {
                    let text = std::fs::read_to_string(&estimates)
                        .map_err(|e| format!("{}: {e}", estimates.display()))?;
                    let value: serde_json::Value = serde_json::from_str(&text)
                        .map_err(|e| format!("{}: {e}", estimates.display()))?;
                    if let Some(mean) = value["mean"]["point_estimate"].as_f64() {
                        let id = path
                            .strip_prefix(&group_path)
                            .map(|p| p.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        out.push(Figure {
                            group: group.file_name().to_string_lossy().into_owned(),
                            id,
                            mean_ns: mean,
                        });
                    }
                }
                continue;
            }
            if let Ok(children) = std::fs::read_dir(&path) {
                for child in children.filter_map(Result::ok) {
                    let child = child.path();
                    if child.is_dir() && child.file_name().is_some_and(|n| n != "report") {
                        stack.push(child);
                    }
                }
            }
        }
    }
    Ok(())
}

/// A duration in ns as a short human figure.
fn duration(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

/// The markdown report.
fn render(
    packages: &[String],
    figures: &[Figure],
    printed: &[String],
    failed: &[String],
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Benchmarks\n");
    let _ = writeln!(
        out,
        "`cargo xtask bench` over {} (criterion, warm-up 1 s, measurement 3 s). Each figure is \
         a ratio to its group's baseline (time / baseline time: below 1 is faster); read the \
         ratios, not the absolute times, on a shared machine.\n",
        packages.join(", ")
    );
    if !failed.is_empty() {
        let _ = writeln!(out, "**Failed** (their figures are missing below):\n");
        for failure in failed {
            let _ = writeln!(out, "- {failure}");
        }
        let _ = writeln!(out);
    }
    let mut groups: Vec<&str> = figures.iter().map(|f| f.group.as_str()).collect();
    groups.dedup();
    for group in groups {
        let members: Vec<&Figure> = figures.iter().filter(|f| f.group == group).collect();
        let marked = members
            .iter()
            .find(|f| BASELINE_MARKS.iter().any(|m| f.id.contains(m)));
        let fastest = members
            .iter()
            .min_by(|a, b| a.mean_ns.total_cmp(&b.mean_ns));
        let Some(baseline) = marked.or(fastest) else {
            continue;
        };
        let _ = writeln!(out, "## {group}\n");
        let _ = writeln!(out, "baseline: `{}`\n", baseline.id);
        let _ = writeln!(out, "| figure | mean | × baseline |");
        let _ = writeln!(out, "|---|---:|---:|");
        for f in &members {
            let _ = writeln!(
                out,
                "| `{}` | {} | {:.3} |",
                f.id,
                duration(f.mean_ns),
                f.mean_ns / baseline.mean_ns
            );
        }
        let _ = writeln!(out);
    }
    if !printed.is_empty() {
        let _ = writeln!(out, "## Figures that are not times\n");
        let _ = writeln!(out, "As the benches printed them:\n");
        for figure in printed {
            let _ = writeln!(out, "- {figure}");
        }
        let _ = writeln!(out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_are_to_the_marked_baseline() {
        let figure = |id: &str, mean_ns| Figure {
            group: "g".into(),
            id: id.into(),
            mean_ns,
        };
        let report = render(
            &["p".into()],
            &[figure("psych", 300.0), figure("rmcp_direct", 200.0)],
            &[],
            &[],
        );
        assert!(report.contains("baseline: `rmcp_direct`"), "{report}");
        assert!(
            report.contains("| `psych` | 300.0 ns | 1.500 |"),
            "{report}"
        );
        assert!(
            report.contains("| `rmcp_direct` | 200.0 ns | 1.000 |"),
            "{report}"
        );
    }

    #[test]
    fn failed_packages_are_listed() {
        let report = render(
            &["p".into()],
            &[],
            &[],
            &["p: cargo bench -p p failed".into()],
        );
        assert!(
            report.contains("**Failed**") && report.contains("- p: cargo bench -p p failed"),
            "{report}"
        );
    }

    #[test]
    fn printed_figures_are_kept_as_printed() {
        assert_eq!(
            printed_figure("figure: catalogue file after 10,000 refreshes: 1,118,208 bytes"),
            Some("catalogue file after 10,000 refreshes: 1,118,208 bytes".to_owned())
        );
        for line in [
            "",
            "figure: ",
            "file_size: 3 bytes",
            "Benchmarking figure: x",
            "  figure: x",
        ] {
            assert_eq!(printed_figure(line), None, "{line:?}");
        }
        let report = render(&["p".into()], &[], &["a: 3 bytes".into()], &[]);
        assert!(
            report.contains("## Figures that are not times") && report.contains("- a: 3 bytes"),
            "{report}"
        );
        assert!(!render(&["p".into()], &[], &[], &[]).contains("not times"));
    }

    #[test]
    fn every_bench_crate_is_found_with_its_benches() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let packages = bench_targets(root).unwrap();
        let benches = |name: &str| {
            packages
                .iter()
                .find(|p| p.name == name)
                .map(|p| p.benches.clone())
                .unwrap_or_default()
        };
        assert_eq!(
            benches("psych-tests"),
            [
                "catalog_stores",
                "lazy_step",
                "mcp_call",
                "reader_paging",
                "record_stores"
            ]
        );
        assert_eq!(benches("psych-record-log"), ["append", "crc", "read"]);
        assert!(packages.iter().all(|p| !p.benches.is_empty()));
        // `--bench NAME` is passed with every package selected, so a name must be unique.
        let mut names: Vec<&String> = packages.iter().flat_map(|p| &p.benches).collect();
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count, "bench target names repeat: {names:?}");
    }
}
