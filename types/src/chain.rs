//! An error and its sources as one line.

/// `error` and each of its sources, `: ` between them: a typed error as one line, each
/// cause said once (psych's errors keep their causes as sources, never in their own text).
///
/// ```
/// let io = std::io::Error::other("disk full");
/// let wrapped = std::io::Error::new(std::io::ErrorKind::Other, io);
/// assert_eq!(psych_types::error_chain(&wrapped), "disk full");
/// ```
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        // An error that prints its source itself (a foreign one) is not repeated.
        if !text.ends_with(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}
