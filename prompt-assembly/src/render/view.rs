//! The model's view of one tool result: its projection's text, or its readable text with
//! the images the request's budget admits as image pieces.

use std::borrow::Cow;

use psych_types::{ContentBlock, Projection, ToolResult};

use crate::image::Budget;

/// One piece of the model's view of a tool result.
#[derive(Debug)]
pub(crate) enum Piece<'a> {
    /// Text: a projection, or readable text between images.
    Text(Cow<'a, str>),
    /// An image block sent as an image, with its sniffed media type.
    Image {
        media_type: &'static str,
        data: &'a [u8],
    },
}

/// The view of `result` under `projection`, in order: a projection is its text; a whole
/// result is its readable text, except that each image block `budget` admits (see
/// [`crate::image`]) is an image piece instead of its placeholder line, the text around it
/// split there. With no budget, no image is admitted: the whole result is its readable text.
pub(crate) fn pieces<'a>(
    result: &'a ToolResult,
    projection: &'a Projection,
    budget: Option<(&mut Budget, bool)>,
) -> Vec<Piece<'a>> {
    if let Projection::Replaced(text) = projection {
        return vec![Piece::Text(Cow::Borrowed(text))];
    }
    let output = &result.output;
    let Some((budget, gif)) = budget else {
        return vec![Piece::Text(output.readable_text())];
    };
    if !output
        .content
        .iter()
        .any(|block| matches!(block, ContentBlock::Image(_)))
    {
        return vec![Piece::Text(output.readable_text())];
    }
    let mut out = Vec::new();
    let mut text = String::new();
    let mut started = false;
    for (position, block) in output.content.iter().enumerate() {
        if let ContentBlock::Image(media) = block
            && let Some(media_type) = budget.admit(&media.data, gif)
        {
            if started {
                out.push(Piece::Text(Cow::Owned(std::mem::take(&mut text))));
            }
            out.push(Piece::Image {
                media_type,
                data: &media.data,
            });
            started = false;
            continue;
        }
        if started {
            text.push('\n');
        }
        text.push_str(&block.readable_segment(position));
        started = true;
    }
    if started {
        out.push(Piece::Text(Cow::Owned(text)));
    }
    out
}
