//! The Args structs as the CLI embeds them: `slipstream app echo|bookinfo`.

use clap::{CommandFactory, Parser, Subcommand};
use slipstream_apps::{BookinfoArgs, BookinfoConfig, EchoArgs, Role};

#[derive(Parser, Debug)]
#[command(name = "slipstream", version)]
struct Cli {
    #[command(subcommand)]
    command: Top,
}

#[derive(Subcommand, Debug)]
enum Top {
    #[command(subcommand)]
    App(App),
}

#[derive(Subcommand, Debug)]
enum App {
    Echo(EchoArgs),
    Bookinfo(BookinfoArgs),
}

fn parse(args: &[&str]) -> Result<App, clap::Error> {
    Cli::try_parse_from(args).map(|cli| match cli.command {
        Top::App(app) => app,
    })
}

#[test]
fn command_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn echo_defaults_and_flags() {
    let App::Echo(args) = parse(&["slipstream", "app", "echo"]).unwrap() else { panic!("not echo") };
    assert_eq!((args.http_port, args.tcp_port, args.bind.to_string(), args.quiet), (8080, 9000, "::".into(), false));
    let App::Echo(args) =
        parse(&["slipstream", "app", "echo", "--http-port", "1", "--tcp-port", "0", "--bind", "0.0.0.0", "--name", "a", "--quiet"])
            .unwrap()
    else {
        panic!("not echo")
    };
    assert_eq!(
        (args.http_port, args.tcp_port, args.bind.to_string(), args.name.as_deref(), args.quiet),
        (1, 0, "0.0.0.0".into(), Some("a"), true)
    );
    assert!(parse(&["slipstream", "app", "echo", "--http-port", "70000"]).is_err());
    assert!(parse(&["slipstream", "app", "echo", "--bind", "localhost"]).is_err());
}

#[test]
fn bookinfo_flags_and_role_values() {
    assert!(parse(&["slipstream", "app", "bookinfo"]).is_err(), "--role is required");
    assert!(parse(&["slipstream", "app", "bookinfo", "--role", "frontend"]).is_err());
    let App::Bookinfo(args) =
        parse(&["slipstream", "app", "bookinfo", "--role", "reviews", "--version", "v3", "--ratings-addr", "127.0.0.1:9"]).unwrap()
    else {
        panic!("not bookinfo")
    };
    assert_eq!((args.role, args.version.as_str(), args.port), (Role::Reviews, "v3", 9080));
    let config = BookinfoConfig::from_args(&args, |_| None).unwrap();
    assert_eq!(config.served_by(), "reviews-v3");
    assert_eq!(config.upstreams().ratings.as_str(), "127.0.0.1:9");
}

#[test]
fn bookinfo_rejects_unknown_versions_before_binding() {
    let App::Bookinfo(args) = parse(&["slipstream", "app", "bookinfo", "--role", "reviews", "--version", "v4"]).unwrap() else {
        panic!("not bookinfo")
    };
    let err = slipstream_apps::run_bookinfo(args).unwrap_err();
    assert!(format!("{err:#}").contains("v1 (no ratings), v2 (black stars) and v3 (red stars)"), "{err:#}");
}

#[test]
fn help_describes_every_flag() {
    let mut cmd = Cli::command();
    let app = cmd.find_subcommand_mut("app").unwrap();
    for (name, flags) in [
        ("echo", &["--http-port", "--tcp-port", "--bind", "--name", "--quiet"][..]),
        ("bookinfo", &["--role", "--version", "--port", "--bind", "--details-addr", "--reviews-addr", "--ratings-addr", "--quiet"][..]),
    ] {
        let help = app.find_subcommand_mut(name).unwrap().render_long_help().to_string();
        for flag in flags {
            let line =
                help.lines().position(|l| l.trim_start().starts_with(flag)).unwrap_or_else(|| panic!("{name}: {flag} missing\n{help}"));
            let described = help.lines().nth(line + 1).is_some_and(|next| !next.trim().is_empty());
            assert!(described, "{name}: {flag} has no description\n{help}");
        }
    }
}
