//! An error and its sources as one line.

/// `error` and each of its sources, `: ` between them: a typed error as one line, each
/// cause said once (psych's errors keep their causes as sources, never in their own text).
///
/// ```
/// #[derive(Debug)]
/// struct Saving(std::io::Error);
/// impl std::fmt::Display for Saving {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("saving the file")
///     }
/// }
/// impl std::error::Error for Saving {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(&self.0)
///     }
/// }
/// let error = Saving(std::io::Error::other("disk full"));
/// assert_eq!(psych_types::error_chain(&error), "saving the file: disk full");
/// ```
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        // A cause an error prints itself (a foreign error's way) is not said again.
        if text != said && !text.ends_with(&format!(": {said}")) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}
