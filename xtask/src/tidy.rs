//! Tidy checks: the conventions of DESIGN.md and STYLE.md that matter enough to be tests.
//!
//! Each check is a function from plain inputs (`cargo metadata` JSON, file paths and
//! contents) to a list of violations, so that it can be tested on a made-up violation as well
//! as run on the real workspace. `cargo xtask ci` runs them first; `cargo test` runs them too.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The core crates, which may depend on no workspace crate but `psych-types`.
pub(crate) const CORE_CRATES: [&str; 6] = [
    "psych-catalog",
    "psych-disclosure",
    "psych-elision",
    "psych-record-log",
    "psych-reader-tool",
    "psych-prompt-assembly",
];

/// The one workspace crate the core crates may depend on.
const SHARED_TYPES: &str = "psych-types";

/// Runs every tidy check on the workspace at `root`; returns the violations found.
pub(crate) fn run_all(root: &Path) -> Result<Vec<String>, String> {
    let metadata = cargo_metadata(root)?;
    let mut violations = dependency_rule(&metadata);
    violations.extend(internal_deps_have_versions(&metadata));
    violations.extend(no_order_preserving_json(&resolved_metadata(root)?));
    let files = rust_files(root)?;
    for path in &files {
        let text = std::fs::read_to_string(path)
            .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
        let shown = path.strip_prefix(root).unwrap_or(path);
        violations.extend(module_doc(shown, &text));
        violations.extend(no_ignore(shown, &text));
    }
    Ok(violations)
}

/// `cargo metadata` of the workspace, without dependencies' own packages (needs nothing
/// downloaded, so it runs offline).
pub(crate) fn cargo_metadata(root: &Path) -> Result<Value, String> {
    metadata(root, &["--no-deps", "--offline"])
}

/// `cargo metadata` with the resolved dependency graph and its features. Not offline: the
/// graph names every platform's crates (TLS pulls in Windows and macOS ones), which a
/// build on this platform never downloads; `--locked` keeps the lockfile as committed.
fn resolved_metadata(root: &Path) -> Result<Value, String> {
    metadata(root, &["--locked"])
}

fn metadata(root: &Path, extra: &[&str]) -> Result<Value, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .args(extra)
        .current_dir(root)
        .output()
        .map_err(|err| format!("cannot run cargo metadata: {err}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    serde_json::from_slice(&output.stdout).map_err(|err| format!("cargo metadata output: {err}"))
}

/// The workspace's packages as `(name, dependencies)` pairs.
fn packages(metadata: &Value) -> impl Iterator<Item = (&str, &[Value])> {
    metadata["packages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|package| {
            let name = package["name"].as_str().unwrap_or("?");
            let deps = package["dependencies"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            (name, deps)
        })
}

/// Names of the workspace's own packages.
fn workspace_names(metadata: &Value) -> Vec<&str> {
    packages(metadata).map(|(name, _)| name).collect()
}

/// The dependency rule of DESIGN.md: a core crate depends on no other workspace crate but
/// `psych-types`, in any dependency kind (normal, dev or build), so each can be picked alone.
pub(crate) fn dependency_rule(metadata: &Value) -> Vec<String> {
    let ours = workspace_names(metadata);
    let mut violations = Vec::new();
    for (name, deps) in packages(metadata) {
        if !CORE_CRATES.contains(&name) {
            continue;
        }
        for dep in deps {
            let dep_name = dep["name"].as_str().unwrap_or("?");
            if dep_name != SHARED_TYPES && ours.contains(&dep_name) {
                let kind = dep["kind"].as_str().unwrap_or("normal");
                violations.push(format!(
                    "dependency rule: core crate {name} depends on {dep_name} ({kind}); core \
                     crates may depend on {SHARED_TYPES} only (DESIGN.md, workspace layout): \
                     move the seam into {SHARED_TYPES} or the composition into psych-runtime"
                ));
            }
        }
    }
    violations
}

/// Internal (path) dependencies give a version too, so each crate stays publishable alone.
pub(crate) fn internal_deps_have_versions(metadata: &Value) -> Vec<String> {
    let mut violations = Vec::new();
    for (name, deps) in packages(metadata) {
        for dep in deps {
            let has_path = dep.get("path").is_some_and(|p| !p.is_null());
            let req = dep["req"].as_str().unwrap_or("*");
            if has_path && req == "*" {
                violations.push(format!(
                    "internal dependency without version: {name} depends on {} by path only; \
                     give it `version` as well",
                    dep["name"].as_str().unwrap_or("?")
                ));
            }
        }
    }
    violations
}

/// serde_json's `preserve_order` feature is never on in the build. Without it a JSON object
/// is a sorted map, and several crates rely on that for byte-stable output (the JSON text
/// view of a tool output that the model sees, the log stores and the reader pages). Cargo
/// unifies features, so one crate turning it on would silently change every other crate's
/// bytes.
pub(crate) fn no_order_preserving_json(resolved: &Value) -> Vec<String> {
    resolved["resolve"]["nodes"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|node| node["id"].as_str().unwrap_or("").contains("serde_json@"))
        .filter(|node| {
            node["features"]
                .as_array()
                .is_some_and(|features| features.iter().any(|f| f == "preserve_order"))
        })
        .map(|node| {
            format!(
                "serde_json is built with preserve_order ({}): JSON object keys would follow \
                 insertion order and break byte-stable output; turn the feature off",
                node["id"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// Every Rust module opens with a `//!` doc comment saying what it is for.
pub(crate) fn module_doc(path: &Path, text: &str) -> Option<String> {
    let first = text.lines().map(str::trim).find(|line| !line.is_empty());
    match first {
        Some(line) if line.starts_with("//!") => None,
        _ => Some(format!(
            "module without doc: {} does not open with a `//!` comment",
            path.display()
        )),
    }
}

/// No test is ignored: assert today's wrong behaviour and say why instead.
pub(crate) fn no_ignore(path: &Path, text: &str) -> Vec<String> {
    // Spelled in two pieces so this file does not match itself.
    let needle = concat!("#[", "ignore");
    text.lines()
        .enumerate()
        .filter(|(_, line)| line.contains(needle))
        .map(|(i, _)| {
            format!(
                "ignored test: {}:{} uses {needle}]; never ignore a test",
                path.display(),
                i + 1
            )
        })
        .collect()
}

/// Every `.rs` file of the workspace, outside `target/` and hidden folders, sorted.
pub(crate) fn rust_files(root: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir)
            .map_err(|err| format!("cannot list {}: {err}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|err| format!("cannot list {}: {err}", dir.display()))?;
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf()
    }

    /// A made-up `cargo metadata` with one core crate depending on the given crates.
    fn metadata_with(core: &str, deps: &[(&str, Option<&str>, &str)]) -> Value {
        let deps: Vec<Value> = deps
            .iter()
            .map(|(name, path, req)| {
                serde_json::json!({"name": name, "path": path, "req": req, "kind": null})
            })
            .collect();
        serde_json::json!({"packages": [
            {"name": core, "dependencies": deps},
            {"name": "psych-types", "dependencies": []},
            {"name": "psych-elision", "dependencies": []},
            {"name": "psych-runtime", "dependencies": []},
        ]})
    }

    #[test]
    fn the_workspace_is_tidy() {
        let violations = run_all(&root()).unwrap();
        assert!(violations.is_empty(), "{}", violations.join("\n"));
    }

    #[test]
    fn every_core_crate_is_a_workspace_member() {
        let metadata = cargo_metadata(&root()).unwrap();
        let names = workspace_names(&metadata);
        for core in CORE_CRATES {
            assert!(names.contains(&core), "{core} missing from {names:?}");
        }
    }

    #[test]
    fn dependency_rule_names_both_crates() {
        let bad = metadata_with(
            "psych-disclosure",
            &[
                ("psych-types", Some("/w/types"), "^0.1.0"),
                ("psych-elision", Some("/w/elision"), "^0.1.0"),
                ("serde", None, "^1"),
            ],
        );
        let violations = dependency_rule(&bad);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].contains("psych-disclosure depends on psych-elision"));
    }

    #[test]
    fn dependency_rule_allows_types_and_external_crates_and_leaves_the_runtime_alone() {
        let good = metadata_with(
            "psych-elision",
            &[
                ("psych-types", Some("/w/types"), "^0.1.0"),
                ("memchr", None, "^2"),
            ],
        );
        assert!(dependency_rule(&good).is_empty());
        let runtime = metadata_with("psych-runtime", &[("psych-elision", Some("/w"), "^0.1.0")]);
        assert!(dependency_rule(&runtime).is_empty());
    }

    #[test]
    fn path_only_internal_dependencies_are_refused() {
        let bad = metadata_with("psych-elision", &[("psych-types", Some("/w/types"), "*")]);
        let violations = internal_deps_have_versions(&bad);
        assert_eq!(violations.len(), 1);
        assert!(violations[0].contains("psych-elision depends on psych-types"));
        let good = metadata_with(
            "psych-elision",
            &[("psych-types", Some("/w/types"), "^0.1.0")],
        );
        assert!(internal_deps_have_versions(&good).is_empty());
    }

    #[test]
    fn order_preserving_json_is_refused() {
        let node = |features: Value| {
            serde_json::json!({"resolve": {"nodes": [
                {"id": "registry+https://github.com/rust-lang/crates.io-index#serde_json@1.0.1",
                 "features": features},
                {"id": "registry+https://github.com/rust-lang/crates.io-index#indexmap@2.0.0",
                 "features": ["preserve_order"]},
            ]}})
        };
        let bad = no_order_preserving_json(&node(serde_json::json!(["std", "preserve_order"])));
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].contains("serde_json is built with preserve_order"));
        assert!(no_order_preserving_json(&node(serde_json::json!(["std"]))).is_empty());
    }

    #[test]
    fn the_build_resolves_serde_json_without_preserve_order() {
        let resolved = resolved_metadata(&root()).unwrap();
        let nodes = resolved["resolve"]["nodes"].as_array().unwrap();
        assert!(
            nodes
                .iter()
                .any(|n| n["id"].as_str().unwrap().contains("serde_json@")),
            "serde_json must be in the resolved graph for this check to mean anything"
        );
        assert!(no_order_preserving_json(&resolved).is_empty());
    }

    #[test]
    fn modules_must_open_with_a_doc_comment() {
        let path = Path::new("x/src/a.rs");
        assert!(module_doc(path, "//! What it is.\nfn f() {}\n").is_none());
        assert!(module_doc(path, "\n\n//! After blank lines.\n").is_none());
        assert!(module_doc(path, "// a plain comment\n//! late\n").is_some());
        assert!(module_doc(path, "use std::fs;\n").is_some());
        assert!(module_doc(path, "").is_some());
    }

    #[test]
    fn ignored_tests_are_found() {
        let path = Path::new("x/tests/t.rs");
        let text = format!(
            "//! t\n#[test]\n{}]\nfn slow() {{}}\n",
            concat!("#[", "ignore")
        );
        let violations = no_ignore(path, &text);
        assert_eq!(violations.len(), 1);
        assert!(violations[0].contains("x/tests/t.rs:3"), "{violations:?}");
        assert!(no_ignore(path, "//! t\n#[test]\nfn fast() {}\n").is_empty());
    }
}
