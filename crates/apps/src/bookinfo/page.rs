//! The HTML of `/productpage`: book details, reviews with stars, and a footer
//! naming every version that served the page.

use std::fmt::Write;

use serde_json::Value;

use super::data::{ProductView, SUMMARY, TITLE};

const DETAIL_FIELDS: [(&str, &str); 8] = [
    ("author", "Author"),
    ("year", "Year"),
    ("type", "Type"),
    ("pages", "Pages"),
    ("publisher", "Publisher"),
    ("language", "Language"),
    ("ISBN-10", "ISBN-10"),
    ("ISBN-13", "ISBN-13"),
];

/// Renders the page. Everything that came from an upstream is escaped: the
/// page must stay well-formed whatever a misbehaving service answers.
pub(crate) fn render(view: &ProductView, served_by: &str) -> String {
    let mut html = String::with_capacity(4096);
    // Writing to a String cannot fail.
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html>\n<head><meta charset=\"utf-8\"><title>Simple Bookstore App</title></head>\n<body>\n\
         <h1>{}</h1>\n<p>{}</p>\n",
        escape(TITLE),
        escape(SUMMARY)
    );

    html.push_str("<h2>Book Details</h2>\n");
    match &view.details {
        Ok(details) => {
            html.push_str("<dl class=\"details\">\n");
            for (key, label) in DETAIL_FIELDS {
                if let Some(value) = details.get(key) {
                    let _ = writeln!(html, "<dt>{label}</dt><dd>{}</dd>", escape(&plain(value)));
                }
            }
            html.push_str("</dl>\n");
        }
        Err(reason) => {
            let _ = writeln!(
                html,
                "<p class=\"error\">Sorry, product details are currently unavailable for this book. ({})</p>",
                escape(reason)
            );
        }
    }

    html.push_str("<h2>Book Reviews</h2>\n");
    match &view.reviews {
        Ok(reviews) => render_reviews(&mut html, reviews),
        Err(reason) => {
            let _ = writeln!(
                html,
                "<p class=\"error\">Sorry, product reviews are currently unavailable for this book. ({})</p>",
                escape(reason)
            );
        }
    }

    let _ = write!(
        html,
        "<footer>Served by: <span class=\"served-by\">{}</span></footer>\n</body>\n</html>\n",
        escape(&view.served_by_chain(served_by).join(" "))
    );
    html
}

fn render_reviews(html: &mut String, reviews: &Value) {
    for review in reviews.get("reviews").and_then(Value::as_array).into_iter().flatten() {
        let field = |key| review.get(key).map(plain).unwrap_or_default();
        let _ = write!(html, "<blockquote>\n<p>{}</p>\n<small>{}</small>", escape(&field("text")), escape(&field("reviewer")));
        if let Some(rating) = review.get("rating") {
            let stars = rating.get("stars").and_then(Value::as_u64).unwrap_or(0).min(5) as usize;
            let color = rating.get("color").map(plain).unwrap_or_default();
            let _ = write!(
                html,
                " <span class=\"stars\" style=\"color: {}\">{}{}</span>",
                escape(&color),
                "\u{2605}".repeat(stars),
                "\u{2606}".repeat(5 - stars)
            );
        }
        html.push_str("\n</blockquote>\n");
    }
    if let Some(reason) = reviews.get("ratings_error") {
        let _ = writeln!(html, "<p class=\"error\">Ratings service is currently unavailable ({})</p>", escape(&plain(reason)));
    }
}

/// A JSON value as text, without the quotes a string would get.
fn plain(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::config::Stars;
    use super::super::data::{details, ratings, reviews, RatingsOutcome};
    use super::*;

    #[test]
    fn full_page_shows_details_stars_and_the_chain() {
        let view = ProductView {
            id: 0,
            details: Ok(details(0, "details-v1")),
            reviews: Ok(reviews(0, "reviews-v3", Stars::Colored("red"), RatingsOutcome::Answered(ratings(0, "ratings-v1")))),
        };
        let html = render(&view, "productpage-v1");
        assert!(html.contains("<dd>William Shakespeare</dd>") && html.contains("<dd>1595</dd>"));
        assert!(html.contains("style=\"color: red\">\u{2605}\u{2605}\u{2605}\u{2605}\u{2605}</span>"), "{html}");
        assert!(html.contains("\u{2605}\u{2605}\u{2605}\u{2605}\u{2606}"));
        assert!(html.contains("Served by: <span class=\"served-by\">productpage-v1 details-v1 reviews-v3 ratings-v1</span>"));
    }

    #[test]
    fn failures_are_shown_and_upstream_text_is_escaped() {
        let view = ProductView {
            id: 0,
            details: Err("details at details:9080: <script>".into()),
            reviews: Ok(reviews(0, "reviews-v2", Stars::Colored("black"), RatingsOutcome::Failed("refused & gone".into()))),
        };
        let html = render(&view, "productpage-v1");
        assert!(html.contains("product details are currently unavailable") && html.contains("&lt;script&gt;"));
        assert!(!html.contains("<script>"));
        assert!(html.contains("Ratings service is currently unavailable (refused &amp; gone)"));
        assert!(html.contains(">productpage-v1 reviews-v2</span>"));
    }
}
