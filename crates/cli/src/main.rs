//! `sluice`: the one binary. `serve` runs a broker; the other subcommands are tools.

mod cluster_health;
mod cluster_queries;
mod cluster_quorum;
mod cluster_tools;
mod consume_tool;
mod debug_bundle;
mod dev_cluster;
mod group_members;
mod group_offsets;
mod kafka_connection;
mod offset_spec;
mod output;
mod partition_tools;
mod produce_tool;
mod record_format;
mod reference;
mod schema_tools;
mod security_tools;
mod serve;
mod share_tools;
mod tools;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Hostile array lengths in requests must not abort the broker (see `GuardedAllocator`).
#[global_allocator]
static ALLOCATOR: sluice_protocol::GuardedAllocator = sluice_protocol::GuardedAllocator;

#[derive(Parser)]
#[command(name = "sluice", version, about = "A Kafka-protocol streaming broker")]
struct Cli {
    #[command(flatten)]
    connection: kafka_connection::ConnectionArgs,
    /// Output of the list and describe commands: text (aligned tables), json or yaml.
    /// Records of produce and consume: text (lines), json (an object per line) or a
    /// kcat-style template such as '%k %v\n' (fields: `sluice consume --help`).
    #[arg(long, short = 'f', global = true, default_value = "text", value_name = "FORMAT")]
    format: String,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Start a broker (single node; defaults: 127.0.0.1:9092, ./sluice-data).
    Serve(serve::ServeArgs),
    /// Create, list, describe, alter the configs of and delete topics.
    Topic(tools::TopicArgs),
    /// Produce records from stdin: lines, kcat-style templates or JSON lines.
    #[command(after_help = record_format::RECORD_FORMAT_HELP)]
    Produce(produce_tool::ProduceArgs),
    /// Print records of a topic, alone or as a member of a consumer group.
    #[command(after_help = record_format::RECORD_FORMAT_HELP)]
    Consume(consume_tool::ConsumeArgs),
    /// List, describe (members, assignments, lag), seek or reset the offsets of, or delete
    /// consumer groups.
    Group(tools::GroupArgs),
    /// List share groups (queues, KIP-932) and describe one (members, start offsets, lag).
    Share(share_tools::ShareArgs),
    /// List, add or remove ACLs (Kafka's kafka-acls), over any listener (-X security.protocol=...).
    Acl(security_tools::AclArgs),
    /// List, add or delete SCRAM users (kafka-configs --entity-type users), over any listener.
    User(security_tools::UserArgs),
    /// Show the cluster's id, brokers and versions; get or set broker configs.
    Cluster(cluster_tools::ClusterArgs),
    /// Collect what support needs into a tarball (no secrets).
    Debug(debug_bundle::DebugArgs),
    /// Register, list, show, check, delete schemas in the Schema Registry (its REST API).
    Schema(schema_tools::SchemaArgs),
    /// Run a local cluster of N nodes as separate processes on 127.0.0.1.
    DevCluster(dev_cluster::DevClusterArgs),
    /// Print shell completions (bash, zsh, fish, ...) for sluice to stdout.
    Completions(reference::CompletionsArgs),
    /// Print the manual page sluice(1) to stdout, or write every subcommand's page to --dir.
    Manpage(reference::ManpageArgs),
    /// Run OpenMessaging-Benchmark workloads against Sluice or any Kafka-protocol broker.
    #[cfg(feature = "bench")]
    Bench(sluice_bench::BenchArgs),
    /// Run OpenMessaging-Benchmark workloads (this build has no bench: `--features bench`).
    #[cfg(not(feature = "bench"))]
    Bench(BenchMissing),
}

/// `sluice bench` in a build without the `bench` feature: says how to get one instead of
/// clap's "unrecognized subcommand".
#[cfg(not(feature = "bench"))]
#[derive(clap::Args)]
struct BenchMissing {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    args: Vec<String>,
}

/// Errors are printed as one line, `error: what: why` (anyhow's chain, no backtrace): the
/// reader is an operator, not a debugger.
/// The README, whose five-minute tour `sluice --help` shows (one text: the tour a reader
/// types is the one the test suite runs, `tests/python/test_readme_tour.py`).
const README: &str = include_str!("../../../README.md");

/// The first shell block of the README's tour, as help text.
fn tour() -> String {
    let section = README.split("## A five-minute tour").nth(1).unwrap_or_default();
    let block = section.split("```sh\n").nth(1).and_then(|rest| rest.split("```").next()).unwrap_or_default();
    format!("A five-minute tour (with `sluice serve` running):\n\n{block}")
}

fn main() -> ExitCode {
    let matches = Cli::command().after_help(tour()).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    if !matches!(cli.command, Command::Serve(_) | Command::DevCluster(_) | Command::Bench(_)) {
        end_quietly_on_a_closed_pipe();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// A tool whose reader went away (`sluice topic describe t | head -1`) ends as `cat` does,
/// killed by SIGPIPE, instead of panicking in `println!`. Rust ignores SIGPIPE so that a
/// server's writes to a closed socket fail instead; the tools' sockets are written with
/// `MSG_NOSIGNAL` (std, librdkafka), so only their stdout raises it. Not for the commands
/// that run brokers.
fn end_quietly_on_a_closed_pipe() {
    // SAFETY: restores the default disposition of one signal before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let connection = &cli.connection;
    // Tables and documents; produce and consume read the flag as a record format.
    let format = || output::Format::parse(&cli.format);
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Topic(args) => tools::topic(connection, format()?, args),
        Command::Produce(args) => produce_tool::produce(connection, &cli.format, args),
        Command::Group(args) => tools::group(connection, format()?, args),
        Command::Share(args) => share_tools::share(connection, format()?, args),
        Command::Acl(args) => security_tools::acl(connection, format()?, args),
        Command::User(args) => security_tools::user(connection, format()?, args),
        Command::Consume(args) => consume_tool::consume(connection, &cli.format, args),
        Command::Cluster(args) => cluster_tools::cluster(connection, format()?, args),
        Command::Debug(args) => debug_bundle::debug(connection, args),
        Command::Schema(args) => schema_tools::schema(args),
        Command::DevCluster(args) => dev_cluster::run(args),
        Command::Completions(args) => reference::completions(Cli::command(), args),
        Command::Manpage(args) => reference::manpage(Cli::command(), args),
        #[cfg(feature = "bench")]
        Command::Bench(args) => sluice_bench::run(args),
        #[cfg(not(feature = "bench"))]
        Command::Bench(_) => anyhow::bail!(
            "this sluice was built without the bench: cargo build --release -p sluice-cli --features bench"
        ),
    }
}
