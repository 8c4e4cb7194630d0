//! One running bookinfo service: answers its own endpoints and, for
//! productpage and reviews v2/v3, calls its upstreams.

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use serde_json::json;

use super::config::{BookinfoConfig, Stars};
use super::data::{self, ProductView, RatingsOutcome, PRODUCT_ID};
use super::page;
use super::routes::{route, Route};
use super::upstream::Upstream;
use crate::http::{json, Body};

const SERVED_BY: HeaderName = HeaderName::from_static("x-served-by");

pub(crate) struct Service {
    config: BookinfoConfig,
    served_by: String,
    served_by_header: HeaderValue,
    upstream: Upstream,
}

impl Service {
    pub(crate) fn new(config: BookinfoConfig) -> Self {
        let served_by = config.served_by();
        // `<role>-v<N>` is always a valid header value.
        let served_by_header = HeaderValue::from_str(&served_by).unwrap_or(HeaderValue::from_static("bookinfo"));
        Service { config, served_by, served_by_header, upstream: Upstream::new() }
    }

    /// Every answer, errors included, carries `x-served-by`.
    pub(crate) async fn handle<B>(&self, req: Request<B>) -> Response<Body> {
        let mut resp = self.answer(req).await;
        resp.headers_mut().insert(SERVED_BY, self.served_by_header.clone());
        resp
    }

    async fn answer<B>(&self, req: Request<B>) -> Response<Body> {
        let by = self.served_by.as_str();
        let headers = req.headers();
        match route(self.config.role(), req.method(), req.uri().path()) {
            Route::Health => json(StatusCode::OK, &json!({ "status": "ok", "served_by": by })),
            Route::Details(id) => json(StatusCode::OK, &data::details(id, by)),
            Route::Ratings(id) => json(StatusCode::OK, &data::ratings(id, by)),
            Route::Reviews(id) => json(StatusCode::OK, &self.reviews(id, headers).await),
            Route::Product(id) => json(StatusCode::OK, &self.product(id, headers).await.to_json(by)),
            Route::Products => json(StatusCode::OK, &data::products(by)),
            Route::ProductPage => {
                let html = page::render(&self.product(PRODUCT_ID, headers).await, by);
                crate::http::with_type(StatusCode::OK, "text/html; charset=utf-8", html.into())
            }
            Route::Index => {
                crate::http::text(StatusCode::OK, format!("bookinfo {by}: /productpage, /api/v1/products, /api/v1/products/<id>, /health"))
            }
            Route::BadId(id) => error(StatusCode::BAD_REQUEST, format!("{id:?} is not a product id (a number)"), by),
            Route::MethodNotAllowed => error(StatusCode::METHOD_NOT_ALLOWED, format!("{} is not allowed; use GET", req.method()), by),
            Route::NotFound => error(StatusCode::NOT_FOUND, format!("no such path {:?}", req.uri().path()), by),
        }
    }

    async fn reviews(&self, id: u64, incoming: &HeaderMap) -> serde_json::Value {
        let stars = self.config.stars();
        let ratings = match stars {
            Stars::None => RatingsOutcome::NotAsked,
            Stars::Colored(_) => {
                let path = format!("/ratings/{id}");
                match self.upstream.get_json("ratings", &self.config.upstreams().ratings, &path, incoming).await {
                    Ok(answer) => RatingsOutcome::Answered(answer),
                    Err(err) => RatingsOutcome::Failed(err.to_string()),
                }
            }
        };
        data::reviews(id, &self.served_by, stars, ratings)
    }

    async fn product(&self, id: u64, incoming: &HeaderMap) -> ProductView {
        let upstreams = self.config.upstreams();
        let (details_path, reviews_path) = (format!("/details/{id}"), format!("/reviews/{id}"));
        let (details, reviews) = tokio::join!(
            self.upstream.get_json("details", &upstreams.details, &details_path, incoming),
            self.upstream.get_json("reviews", &upstreams.reviews, &reviews_path, incoming),
        );
        ProductView { id, details: details.map_err(|e| e.to_string()), reviews: reviews.map_err(|e| e.to_string()) }
    }
}

fn error(status: StatusCode, reason: String, served_by: &str) -> Response<Body> {
    json(status, &json!({ "error": reason, "served_by": served_by }))
}
