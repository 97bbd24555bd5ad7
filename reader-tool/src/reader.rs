//! [`Reader`]: resolves a handle in one Run's [`RecordSource`] and answers a read.

use psych_types::{LineMark, RecordHandle, RecordSource, ToolDefinition};
use serde_json::Value;

use crate::scan::{Bounds, Scan, checked_mark};
use crate::{
    Answer, CallError, HandleProblem, InvalidHandle, Limits, Page, ReadArgs, ResultInfo,
    tool_definition,
};

/// Answers `read_tool_output` calls over one Run's [`RecordSource`], in process.
///
/// It holds its source, borrowed (`Reader::new(&log)`: a shared reference to a source is a
/// source) or owned (`Reader::new(log)`), and keeps no state between calls: every read resolves its handle
/// again and scans the stored result in bounded chunks ([`Limits::chunk_bytes`]). A page at
/// offset `N` reads the result from the source's [`line_mark`](RecordSource::line_mark) for
/// line `N` to that line (from the result's start for a source that keeps no line index;
/// from at most 128 KiB before the line for a record log's result up to 256 MiB), and no
/// further than one chunk past its last line (or to the end of a result of at most
/// [`Limits::count_all_bytes`], to count its lines); a `grep` reads on to the next match
/// after a full page (to know that more follows), or to the end. Memory stays bounded by
/// the limits whatever the result's size.
#[derive(Debug)]
pub struct Reader<S> {
    source: S,
    limits: Limits,
}

impl<S: RecordSource> Reader<S> {
    /// A reader with the default [`Limits`].
    pub fn new(source: S) -> Self {
        Self {
            source,
            limits: Limits::default(),
        }
    }

    /// A reader with the given limits (checked when they were built:
    /// [`LimitsBuilder::build`](crate::LimitsBuilder::build)).
    pub fn with_limits(source: S, limits: Limits) -> Self {
        Self { source, limits }
    }

    /// The source it reads.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// The source back.
    pub fn into_source(self) -> S {
        self.source
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The tool's definition under this reader's limits.
    pub fn definition(&self) -> ToolDefinition {
        tool_definition(&self.limits)
    }

    /// Answers a call with the model's JSON arguments.
    ///
    /// Malformed arguments are [`Answer::Invalid`], for the model. A handle given as a string
    /// is resolved even when other arguments are malformed, so a foreign or forged handle is
    /// always the corruption error, never masked by a validation error.
    ///
    /// # Errors
    ///
    /// As [`Reader::read`].
    pub fn call(&self, arguments: &Value) -> Result<Answer, CallError<S::Error>> {
        match ReadArgs::from_json(arguments, &self.limits) {
            Ok(args) => self.read(&args),
            Err(invalid) => {
                if let Some(Value::String(handle)) = arguments.get("handle") {
                    self.resolve(handle)?;
                }
                Ok(Answer::Invalid(invalid))
            }
        }
    }

    /// Answers a call with parsed arguments.
    ///
    /// The handle is resolved first; then arguments that fail [`ReadArgs::validate`] are
    /// [`Answer::Invalid`], and the result's readable text is read into an [`Answer::Page`]
    /// (a binary block is one placeholder line there, naming its kind, MIME type and size).
    ///
    /// # Errors
    ///
    /// [`CallError::InvalidDeferredHandle`] when the handle does not parse, names another
    /// Run, names no record, or names a record that is not a tool result;
    /// [`CallError::Source`] and [`CallError::ShortRead`] when the source fails.
    pub fn read(&self, args: &ReadArgs) -> Result<Answer, CallError<S::Error>> {
        let info = self.resolve(&args.handle)?;
        if let Err(invalid) = args.validate(&self.limits) {
            return Ok(Answer::Invalid(invalid));
        }
        let bounds = Bounds {
            limit: args.limit.unwrap_or(self.limits.default_limit) as usize,
            line_cap: self.limits.max_line_bytes,
            page_budget: self.limits.max_page_bytes,
            count_all: self.limits.count_all_bytes,
        };
        let mark = if args.offset == 0 {
            LineMark::START
        } else {
            let mark = self
                .source
                .line_mark(&info.handle, args.offset)
                .map_err(CallError::Source)?;
            checked_mark(mark, args.offset, info.len)
        };
        let mut scan = Scan::from_mark(
            &self.source,
            &info.handle,
            info.len,
            self.limits.chunk_bytes,
            mark,
        );
        let found = match &args.grep {
            None => scan.read_lines(args.offset, args.byte, bounds)?,
            Some(needle) => scan.grep(args.offset, args.byte, needle.as_bytes(), bounds)?,
        };
        Ok(Answer::Page(Page {
            result: info,
            offset: args.offset,
            byte: args.byte,
            grep: args.grep.clone(),
            lines: found.lines,
            total_lines: found.total_lines,
            next_offset: found.next_offset,
            stopped_at: found.stopped_at,
            ends_without_newline: found.ends_without_newline,
            max_line_bytes: self.limits.max_line_bytes,
        }))
    }

    /// Resolves a handle string to a tool result of this reader's Run.
    ///
    /// A handle naming another Run is refused before the source is asked anything.
    ///
    /// # Errors
    ///
    /// As [`Reader::read`], without [`CallError::ShortRead`].
    pub fn resolve(&self, handle: &str) -> Result<ResultInfo, CallError<S::Error>> {
        let invalid = |problem| InvalidHandle {
            handle: handle.to_owned(),
            problem,
        };
        let parsed: RecordHandle = handle
            .parse()
            .map_err(|err| invalid(HandleProblem::Malformed(err)))?;
        let serving = self.source.run();
        if &parsed.run != serving {
            return Err(invalid(HandleProblem::OtherRun {
                named: parsed.run,
                serving: serving.clone(),
            })
            .into());
        }
        let Some(info) = self
            .source
            .output_info(&parsed)
            .map_err(CallError::Source)?
        else {
            let problem = match self.source.record(&parsed).map_err(CallError::Source)? {
                Some(_) => HandleProblem::NotToolResult,
                None => HandleProblem::Unresolved,
            };
            return Err(invalid(problem).into());
        };
        Ok(ResultInfo {
            handle: parsed,
            name: info.name,
            kind: info.kind,
            len: info.len,
            is_error: info.is_error,
        })
    }
}

/// Answers one call over `source` with the default [`Limits`]: the whole tool in one call.
///
/// # Errors
///
/// As [`Reader::read`].
pub fn read_tool_output<S: RecordSource>(
    source: &S,
    arguments: &Value,
) -> Result<Answer, CallError<S::Error>> {
    Reader::new(source).call(arguments)
}
