//! The documents each bookinfo service answers with, as pure functions of
//! their inputs (including the outcome of upstream calls), so every degraded
//! case is a plain unit test.

use serde_json::{json, Value};

use super::config::Stars;

/// The one product of the bookstore, as the real sample has it.
pub(crate) const PRODUCT_ID: u64 = 0;
pub(crate) const TITLE: &str = "The Comedy of Errors";
pub(crate) const SUMMARY: &str = "The Comedy of Errors is one of William Shakespeare's early plays. \
    It is his shortest and one of his most farcical comedies, with a major part of the humour \
    coming from slapstick and mistaken identity, in addition to puns and word play.";

/// `GET /api/v1/products`.
pub(crate) fn products(served_by: &str) -> Value {
    json!([{ "id": PRODUCT_ID, "title": TITLE, "descriptionHtml": SUMMARY, "served_by": served_by }])
}

/// `GET /details/{id}`.
pub(crate) fn details(id: u64, served_by: &str) -> Value {
    json!({
        "id": id,
        "author": "William Shakespeare",
        "year": 1595,
        "type": "paperback",
        "pages": 200,
        "publisher": "PublisherA",
        "language": "English",
        "ISBN-10": "1234567890",
        "ISBN-13": "123-1234567890",
        "served_by": served_by,
    })
}

/// `GET /ratings/{id}`.
pub(crate) fn ratings(id: u64, served_by: &str) -> Value {
    json!({ "id": id, "ratings": { "Reviewer1": 5, "Reviewer2": 4 }, "served_by": served_by })
}

const REVIEWS: [(&str, &str); 2] = [
    ("Reviewer1", "An extremely entertaining play by Shakespeare. The slapstick humour is refreshing!"),
    ("Reviewer2", "Absolutely fun and entertaining. The play lacks thematic depth when compared to other plays by Shakespeare."),
];

/// What reviews got from ratings.
#[derive(Debug)]
pub(crate) enum RatingsOutcome {
    /// v1 does not call ratings.
    NotAsked,
    /// The ratings answer, not yet checked.
    Answered(Value),
    Failed(String),
}

/// `GET /reviews/{id}`: two reviews, with stars when ratings answered, and
/// `ratings_error` (still a 200) when it did not, as the real one degrades.
pub(crate) fn reviews(id: u64, served_by: &str, stars: Stars, ratings: RatingsOutcome) -> Value {
    let (ratings, ratings_served_by, ratings_error) = match ratings {
        RatingsOutcome::NotAsked => (None, None, None),
        RatingsOutcome::Failed(reason) => (None, None, Some(reason)),
        RatingsOutcome::Answered(answer) => match answer.get("ratings").and_then(Value::as_object) {
            Some(map) => (Some(map.clone()), answer.get("served_by").cloned(), None),
            None => (None, None, Some("ratings answer has no \"ratings\" object".to_owned())),
        },
    };
    let color = match stars {
        Stars::Colored(color) => color,
        Stars::None => "",
    };
    let reviews: Vec<Value> = REVIEWS
        .iter()
        .map(|(reviewer, text)| {
            let mut review = json!({ "reviewer": reviewer, "text": text });
            if let Some(n) = ratings.as_ref().and_then(|r| r.get(*reviewer)).and_then(Value::as_u64) {
                review["rating"] = json!({ "stars": n, "color": color });
            }
            review
        })
        .collect();
    let mut doc = json!({ "id": id, "reviews": reviews, "served_by": served_by });
    if let Some(by) = ratings_served_by {
        doc["ratings_served_by"] = by;
    }
    if let Some(reason) = ratings_error {
        doc["ratings_error"] = Value::String(reason);
    }
    doc
}

/// What productpage got from its two upstreams.
#[derive(Debug)]
pub(crate) struct ProductView {
    pub id: u64,
    pub details: Result<Value, String>,
    pub reviews: Result<Value, String>,
}

impl ProductView {
    /// `GET /api/v1/products/{id}`: the upstream answers embedded as they
    /// came, an `*_error` string in place of a failed one.
    pub(crate) fn to_json(&self, served_by: &str) -> Value {
        let mut doc = json!({ "id": self.id, "served_by": served_by });
        for (key, outcome) in [("details", &self.details), ("reviews", &self.reviews)] {
            match outcome {
                Ok(value) => doc[key] = value.clone(),
                Err(reason) => doc[format!("{key}_error")] = Value::String(reason.clone()),
            }
        }
        doc
    }

    /// Who served the page, front to back: `productpage-v1 details-v1
    /// reviews-v3 ratings-v1`, the line that shows where the mesh routed.
    pub(crate) fn served_by_chain(&self, served_by: &str) -> Vec<String> {
        let mut chain = vec![served_by.to_owned()];
        let by = |doc: &Value, key: &str| doc.get(key).and_then(Value::as_str).map(str::to_owned);
        if let Ok(details) = &self.details {
            chain.extend(by(details, "served_by"));
        }
        if let Ok(reviews) = &self.reviews {
            chain.extend(by(reviews, "served_by"));
            chain.extend(by(reviews, "ratings_served_by"));
        }
        chain
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stars_of(doc: &Value) -> Vec<Option<(u64, String)>> {
        doc["reviews"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.get("rating").map(|s| (s["stars"].as_u64().unwrap(), s["color"].as_str().unwrap().to_owned())))
            .collect()
    }

    #[test]
    fn v1_has_no_stars() {
        let doc = reviews(0, "reviews-v1", Stars::None, RatingsOutcome::NotAsked);
        assert_eq!(stars_of(&doc), [None, None]);
        assert!(doc.get("ratings_error").is_none() && doc.get("ratings_served_by").is_none());
    }

    #[test]
    fn stars_take_the_version_colour_and_name_ratings() {
        let doc = reviews(0, "reviews-v3", Stars::Colored("red"), RatingsOutcome::Answered(ratings(0, "ratings-v1")));
        assert_eq!(stars_of(&doc), [Some((5, "red".into())), Some((4, "red".into()))]);
        assert_eq!(doc["ratings_served_by"], "ratings-v1");
        assert_eq!(doc["served_by"], "reviews-v3");
    }

    #[test]
    fn failed_or_malformed_ratings_degrade_to_an_error_string() {
        let failed = reviews(0, "reviews-v2", Stars::Colored("black"), RatingsOutcome::Failed("timed out".into()));
        assert_eq!(failed["ratings_error"], "timed out");
        assert_eq!(stars_of(&failed), [None, None]);
        let odd = reviews(0, "reviews-v2", Stars::Colored("black"), RatingsOutcome::Answered(json!({"x": 1})));
        assert!(odd["ratings_error"].as_str().unwrap().contains("no \"ratings\""));
    }

    #[test]
    fn product_view_embeds_answers_and_errors() {
        let view = ProductView {
            id: 0,
            details: Ok(details(0, "details-v1")),
            reviews: Err("reviews at reviews:9080: answered 503 Service Unavailable".into()),
        };
        let doc = view.to_json("productpage-v1");
        assert_eq!(doc["details"]["served_by"], "details-v1");
        assert!(doc.get("reviews").is_none());
        assert!(doc["reviews_error"].as_str().unwrap().contains("503"));
        assert_eq!(view.served_by_chain("productpage-v1"), ["productpage-v1", "details-v1"]);
    }
}
