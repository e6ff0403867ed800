//! The route table: what each kind of path matches, and file order.

use super::*;

fn route(name: &str, methods: &[Method], path: PathMatch) -> Route {
    Route {
        name: Arc::from(name),
        matcher: Match {
            methods: methods.to_vec(),
            path,
            case_sensitive: true,
            format_suffix: false,
            conditions: Conditions::default(),
        },
        limits: Vec::new(),
        upgrades: Arc::from(Vec::new()),
        tiers: None,
        answers: Default::default(),
        addresses: Default::default(),
    }
}

fn table(routes: Vec<Route>) -> RouteTable {
    RouteTable::new(&routes, &route("default", &[], PathMatch::Any))
}

fn lit(s: &str) -> Segment {
    Segment::Literal(s.to_owned())
}

#[test]
fn prefix_is_segment_aware() {
    let t = table(vec![route("api", &[], PathMatch::Prefix("/api".into()))]);
    for (path, want) in [
        ("/api", "api"),
        ("/api/", "api"),
        ("/api/v1/x", "api"),
        ("/apix", "default"),
        ("/ap", "default"),
        ("/", "default"),
    ] {
        assert_eq!(&*t.route(&Method::GET, path).name, want, "{path}");
    }
}

#[test]
fn root_prefix_matches_everything() {
    let t = table(vec![route("all", &[], PathMatch::Prefix("/".into()))]);
    assert_eq!(&*t.route(&Method::GET, "/anything/at/all").name, "all");
}

#[test]
fn methods_and_exact_paths() {
    let t = table(vec![route(
        "login",
        &[Method::POST],
        PathMatch::Exact("/login".into()),
    )]);
    assert_eq!(&*t.route(&Method::POST, "/login").name, "login");
    assert_eq!(&*t.route(&Method::GET, "/login").name, "default");
    // One trailing slash is the same resource to most apps.
    assert_eq!(&*t.route(&Method::POST, "/login/").name, "login");
    assert_eq!(&*t.route(&Method::POST, "/login/x").name, "default");
    assert_eq!(&*t.route(&Method::POST, "/loginx").name, "default");
    let root = table(vec![route("root", &[], PathMatch::Exact("/".into()))]);
    assert_eq!(&*root.route(&Method::GET, "/").name, "root");
    assert_eq!(&*root.route(&Method::GET, "//").name, "default");
}

#[test]
fn a_get_route_also_limits_head() {
    let t = table(vec![
        route("get", &[Method::GET], PathMatch::Exact("/get".into())),
        route("head", &[Method::HEAD], PathMatch::Exact("/head".into())),
    ]);
    assert_eq!(&*t.route(&Method::HEAD, "/get").name, "get");
    assert_eq!(&*t.route(&Method::HEAD, "/head").name, "head");
    assert_eq!(&*t.route(&Method::GET, "/head").name, "default");
}

#[test]
fn case_insensitive_routes_match_any_letter_case() {
    let mut login = route("login", &[], PathMatch::Exact("/Login".into()));
    login.matcher.case_sensitive = false;
    let mut api = route("api", &[], PathMatch::Prefix("/api".into()));
    api.matcher.case_sensitive = false;
    let mut user = route(
        "user",
        &[],
        PathMatch::Template(vec![lit("users"), Segment::Param("id".into())]),
    );
    user.matcher.case_sensitive = false;
    let sensitive = route("exact", &[], PathMatch::Exact("/Exact".into()));
    let t = table(vec![login, api, user, sensitive]);
    for (path, want) in [
        ("/login", "login"),
        ("/LOGIN/", "login"),
        ("/API/v1", "api"),
        ("/Users/7", "user"),
        ("/Exact", "exact"),
        ("/exact", "default"),
        ("/apix", "default"),
    ] {
        assert_eq!(&*t.route(&Method::GET, path).name, want, "{path}");
    }
}

/// Express, Koa and Nest route `/LOGIN` and `/Login/` to `/login`:
/// a route written without `case_sensitive` limits every spelling.
#[test]
fn routes_match_any_letter_case_unless_they_say_otherwise() {
    let with = |path: PathMatch| Match {
        path,
        ..Match::default()
    };
    let exact = with(PathMatch::Exact("/login".into()));
    let prefix = with(PathMatch::Prefix("/api".into()));
    let template = with(PathMatch::Template(vec![
        lit("users"),
        Segment::Param("id".into()),
    ]));
    for (matcher, path) in [
        (&exact, "/login"),
        (&exact, "/LOGIN"),
        (&exact, "/Login/"),
        (&prefix, "/API/x"),
        (&prefix, "/Api"),
        (&template, "/USERS/7/"),
    ] {
        assert!(matcher.matches(&Method::POST, path), "{path}");
    }
    for (matcher, path) in [(&exact, "/logins"), (&prefix, "/APIx")] {
        assert!(!matcher.matches(&Method::POST, path), "{path}");
    }
    let sensitive = Match {
        case_sensitive: true,
        ..exact.clone()
    };
    assert!(sensitive.matches(&Method::POST, "/login/"));
    assert!(!sensitive.matches(&Method::POST, "/LOGIN"));
}

#[test]
fn templates_capture_exactly_one_segment() {
    let segments = vec![lit("users"), Segment::Param("id".into()), lit("posts")];
    let t = table(vec![route("posts", &[], PathMatch::Template(segments))]);
    assert_eq!(&*t.route(&Method::GET, "/users/42/posts").name, "posts");
    assert_eq!(&*t.route(&Method::GET, "/users/42/posts/").name, "posts");
    for path in [
        "/users//posts",
        "/users/42",
        "/users/42/posts/1",
        "/users/4/2/posts",
        "/users/42/posts//",
    ] {
        assert_eq!(&*t.route(&Method::GET, path).name, "default", "{path}");
    }
}

#[test]
fn first_match_in_file_order_wins() {
    let t = table(vec![
        route("specific", &[], PathMatch::Exact("/api/login".into())),
        route("api", &[], PathMatch::Prefix("/api".into())),
        route("never", &[], PathMatch::Exact("/api/login".into())),
    ]);
    assert_eq!(&*t.route(&Method::GET, "/api/login").name, "specific");
    assert_eq!(&*t.route(&Method::GET, "/api/other").name, "api");
}

#[test]
fn a_format_suffix_extends_the_last_segment_only() {
    let suffixed = |name: &str, path: PathMatch| {
        let mut r = route(name, &[], path);
        r.matcher.format_suffix = true;
        r
    };
    let t = table(vec![
        suffixed("login", PathMatch::Exact("/login".into())),
        suffixed(
            "edit",
            PathMatch::Template(vec![lit("users"), Segment::Param("id".into()), lit("edit")]),
        ),
        suffixed("api", PathMatch::Prefix("/api".into())),
        route("plain", &[], PathMatch::Exact("/plain".into())),
    ]);
    for (path, want) in [
        ("/login", "login"),
        ("/login.json", "login"),
        ("/login.html/", "login"),
        ("/login.tar.gz", "login"),
        ("/login.", "default"),
        ("/login.json/x", "default"),
        ("/loginx", "default"),
        ("/login/.json", "default"),
        ("/users/7/edit.json", "edit"),
        ("/users/7/edit.", "default"),
        ("/users.json/7/edit", "default"),
        ("/api.json", "api"),
        ("/api/x.json", "api"),
        ("/api.json/x", "default"),
        ("/plain.json", "default"),
    ] {
        assert_eq!(&*t.route(&Method::GET, path).name, want, "{path}");
    }
}
