//! Small files the runtime rewrites (a Run's `opened.json`, the kept listings' sources).

use std::io::Write as _;
use std::path::Path;

/// Replaces `path` with `bytes`, whole or not at all: written beside it (`<path>.tmp`),
/// synced, renamed over it, the folder synced. Blocking. The runtime's one way to rewrite
/// a small file a reader must never see half of.
pub(crate) fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut aside = path.as_os_str().to_owned();
    aside.push(".tmp");
    let mut file = std::fs::File::create(&aside)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&aside, path)?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    std::fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()
}
