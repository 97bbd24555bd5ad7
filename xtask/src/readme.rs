//! The example in each published crate's README, kept the same as its `lib.rs` example.
//!
//! crates.io shows a crate's README, not its rustdoc, and a README is not compiled: its
//! example would drift from the code unnoticed. So the README's first ```` ```rust ```` block
//! must be the `# Example` of the crate's `lib.rs` (which is a doc test), wrapped in a
//! `fn main` so that it reads as a whole program: rustdoc's hidden lines (`# …`) dropped, the
//! rest indented by four spaces, and `Ok(())` at the end. Tidy checks it;
//! `cargo xtask sync-readmes` rewrites the block from `lib.rs`.

use std::ops::Range;
use std::path::Path;

/// The first line of a README example: the `main` the `lib.rs` example runs in as a doc
/// test (every crate's example ends `# Ok::<(), Box<dyn std::error::Error>>(())`).
const MAIN: &str = "fn main() -> Result<(), Box<dyn std::error::Error>> {";

/// The code of the first fenced block under `# Example` (or `# Examples`) in the `//!` doc of
/// a `lib.rs`, one string with a line break after every line, hidden lines (`# …`) dropped.
/// `None` when the doc has no such block.
pub(crate) fn lib_example(lib_rs: &str) -> Option<String> {
    let doc = lib_rs
        .lines()
        .map(str::trim_start)
        .take_while(|line| line.starts_with("//!") || line.starts_with("#![") || line.is_empty())
        .filter_map(|line| line.strip_prefix("//!"))
        .map(|line| line.strip_prefix(' ').unwrap_or(line));
    let mut heading = false;
    let mut inside = false;
    let mut code = String::new();
    for line in doc {
        if !heading {
            heading = matches!(line.trim_end(), "# Example" | "# Examples");
        } else if !inside {
            inside = line.starts_with("```");
        } else if line.starts_with("```") {
            return Some(code);
        } else if line != "#" && !line.starts_with("# ") {
            code.push_str(line);
            code.push('\n');
        }
    }
    None
}

/// The README block for a `lib.rs` example: the code in a `fn main`, as [`lib_example`]'s
/// module doc describes.
pub(crate) fn readme_block(example: &str) -> String {
    let mut block = format!("{MAIN}\n");
    for line in example.lines() {
        if !line.is_empty() {
            block.push_str("    ");
            block.push_str(line);
        }
        block.push('\n');
    }
    block.push_str("    Ok(())\n}\n");
    block
}

/// The byte range of the contents of the README's first ```` ```rust ```` block (from the
/// line after the opening fence to the start of the closing one).
pub(crate) fn first_rust_block(readme: &str) -> Option<Range<usize>> {
    let mut offset = 0;
    let mut start = None;
    for line in readme.split_inclusive('\n') {
        let fence = line.trim_end();
        match start {
            None if fence == "```rust" => start = Some(offset + line.len()),
            Some(from) if fence == "```" => return Some(from..offset),
            _ => {}
        }
        offset += line.len();
    }
    None
}

/// A violation when the README's first Rust block is not the `lib.rs` example in a `main`.
/// `crate_dir` names the crate in the message.
pub(crate) fn example_matches(crate_dir: &Path, lib_rs: &str, readme: &str) -> Option<String> {
    let example = lib_example(lib_rs)?;
    let expected = readme_block(&example);
    let shown = crate_dir.display();
    match first_rust_block(readme) {
        Some(range) if readme[range.clone()] == expected => None,
        Some(_) => Some(format!(
            "README example out of date: {shown}/README.md's first ```rust block is not the \
             `# Example` of {shown}/src/lib.rs in a `fn main`; run `cargo xtask sync-readmes`"
        )),
        None => Some(format!(
            "README without example: {shown}/README.md has no ```rust block; add one (empty) \
             and run `cargo xtask sync-readmes` to fill it from {shown}/src/lib.rs"
        )),
    }
}

/// The README with its first Rust block replaced by the `lib.rs` example in a `main`, or
/// `None` when there is nothing to write (no example, no block, or already the same).
pub(crate) fn synced(lib_rs: &str, readme: &str) -> Option<String> {
    let expected = readme_block(&lib_example(lib_rs)?);
    let range = first_rust_block(readme)?;
    if readme[range.clone()] == expected {
        return None;
    }
    let mut out = String::with_capacity(readme.len() + expected.len());
    out.push_str(&readme[..range.start]);
    out.push_str(&expected);
    out.push_str(&readme[range.end..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: &str = "//! A crate.\n//!\n//! # Example\n//!\n//! ```\n//! use a::B;\n//!\n\
                       //! let b = B::new()?;\n//! # Ok::<(), Box<dyn std::error::Error>>(())\n\
                       //! ```\n\n#![forbid(unsafe_code)]\n\npub struct B;\n";

    #[test]
    fn the_example_is_read_without_its_hidden_lines() {
        assert_eq!(
            lib_example(LIB).unwrap(),
            "use a::B;\n\nlet b = B::new()?;\n"
        );
        assert!(lib_example("//! No example here.\n").is_none());
        // A fence that never closes is no example.
        assert!(lib_example("//! # Example\n//! ```\n//! let a = 1;\n").is_none());
    }

    #[test]
    fn the_block_is_the_example_in_a_main() {
        let block = readme_block("use a::B;\n\nlet b = B::new()?;\n");
        assert_eq!(
            block,
            format!("{MAIN}\n    use a::B;\n\n    let b = B::new()?;\n    Ok(())\n}}\n")
        );
    }

    #[test]
    fn a_stale_or_missing_readme_example_is_found_and_synced() {
        let dir = Path::new("a");
        let good = format!(
            "# a\n\n```rust\n{}```\n\n```rust\nother\n```\n",
            readme_block(&lib_example(LIB).unwrap())
        );
        assert!(example_matches(dir, LIB, &good).is_none());
        assert!(synced(LIB, &good).is_none());

        let stale = "# a\n\n```rust\nfn main() {}\n```\n\n```rust\nother\n```\n";
        let found = example_matches(dir, LIB, stale).unwrap();
        assert!(found.contains("a/README.md"), "{found}");
        assert_eq!(synced(LIB, stale).unwrap(), good);

        let none = "# a\n\n```sh\ncargo add a\n```\n";
        assert!(
            example_matches(dir, LIB, none)
                .unwrap()
                .contains("no ```rust block")
        );
        // A crate without a lib example (the cli) has nothing to check.
        assert!(example_matches(dir, "//! A binary.\n", none).is_none());
    }
}
