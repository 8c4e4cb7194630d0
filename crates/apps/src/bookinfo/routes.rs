//! Which endpoint a request is for, decided from role, method and path alone
//! (no I/O), so the routing table is a plain unit test.

use http::Method;

use super::args::Role;

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Health,
    Details(u64),
    Ratings(u64),
    Reviews(u64),
    Index,
    ProductPage,
    Products,
    Product(u64),
    /// The path names an endpoint but its id is not a number.
    BadId(String),
    MethodNotAllowed,
    NotFound,
}

pub(crate) fn route(role: Role, method: &Method, path: &str) -> Route {
    if !matches!(*method, Method::GET | Method::HEAD) {
        return Route::MethodNotAllowed;
    }
    if path == "/health" {
        return Route::Health;
    }
    let with_id = |prefix: &str, make: fn(u64) -> Route| {
        let id = path.strip_prefix(prefix)?;
        Some(match id.parse::<u64>() {
            Ok(id) => make(id),
            _ => Route::BadId(id.to_owned()),
        })
    };
    let found = match role {
        Role::Details => with_id("/details/", Route::Details),
        Role::Ratings => with_id("/ratings/", Route::Ratings),
        Role::Reviews => with_id("/reviews/", Route::Reviews),
        Role::Productpage => match path {
            "/" | "/index.html" => Some(Route::Index),
            "/productpage" => Some(Route::ProductPage),
            "/api/v1/products" => Some(Route::Products),
            _ => with_id("/api/v1/products/", Route::Product),
        },
    };
    found.unwrap_or(Route::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_table() {
        let get = Method::GET;
        let cases = [
            (Role::Details, &get, "/details/0", Route::Details(0)),
            (Role::Details, &get, "/details/42", Route::Details(42)),
            (Role::Details, &get, "/details/x", Route::BadId("x".into())),
            (Role::Details, &get, "/details/", Route::BadId("".into())),
            (Role::Details, &get, "/details/-1", Route::BadId("-1".into())),
            (Role::Details, &get, "/details/1/2", Route::BadId("1/2".into())),
            (Role::Details, &get, "/ratings/0", Route::NotFound),
            (Role::Ratings, &get, "/ratings/7", Route::Ratings(7)),
            (Role::Reviews, &get, "/reviews/0", Route::Reviews(0)),
            (Role::Reviews, &Method::HEAD, "/health", Route::Health),
            (Role::Ratings, &get, "/health", Route::Health),
            (Role::Productpage, &get, "/productpage", Route::ProductPage),
            (Role::Productpage, &get, "/", Route::Index),
            (Role::Productpage, &get, "/api/v1/products", Route::Products),
            (Role::Productpage, &get, "/api/v1/products/0", Route::Product(0)),
            (Role::Productpage, &get, "/api/v1/products/zero", Route::BadId("zero".into())),
            (Role::Productpage, &get, "/details/0", Route::NotFound),
            (Role::Productpage, &Method::POST, "/productpage", Route::MethodNotAllowed),
        ];
        for (role, method, path, want) in cases {
            assert_eq!(route(role, method, path), want, "{role:?} {method} {path}");
        }
    }
}
