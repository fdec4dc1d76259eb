//! `sluice`: the one binary. `serve` runs a broker; the other subcommands are tools.

mod cluster_health;
mod dev_cluster;
mod kafka_connection;
mod output;
mod reference;
mod schema_tools;
mod security_tools;
mod serve;
mod share_tools;
mod tools;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// Hostile array lengths in requests must not abort the broker (see `GuardedAllocator`).
#[global_allocator]
static ALLOCATOR: sluice_protocol::GuardedAllocator = sluice_protocol::GuardedAllocator;

#[derive(Parser)]
#[command(name = "sluice", version, about = "A Kafka-protocol streaming broker")]
struct Cli {
    #[command(flatten)]
    connection: kafka_connection::ConnectionArgs,
    /// Output of the list and describe commands: text (aligned tables), json or yaml.
    #[arg(long, global = true, value_enum, default_value_t = output::Format::Text)]
    format: output::Format,
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
    /// Produce lines from stdin as records.
    Produce(tools::ProduceArgs),
    /// Print records of a topic.
    Consume(tools::ConsumeArgs),
    /// List, describe (members, lag), reset the offsets of, or delete consumer groups.
    Group(tools::GroupArgs),
    /// List share groups (queues, KIP-932) and describe one (members, start offsets, lag).
    Share(share_tools::ShareArgs),
    /// List, add or remove ACLs (Kafka's kafka-acls), over any listener (-X security.protocol=...).
    Acl(security_tools::AclArgs),
    /// List, add or delete SCRAM users (kafka-configs --entity-type users), over any listener.
    User(security_tools::UserArgs),
    /// Show the cluster's brokers and partition health; `cluster health --wait` for scripts.
    Cluster(tools::ClusterArgs),
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
fn main() -> ExitCode {
    let cli = Cli::parse();
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
    let (connection, format) = (&cli.connection, cli.format);
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Topic(args) => tools::topic(connection, format, args),
        Command::Produce(args) => tools::produce(connection, args),
        Command::Group(args) => tools::group(connection, format, args),
        Command::Share(args) => share_tools::share(connection, format, args),
        Command::Acl(args) => security_tools::acl(connection, format, args),
        Command::User(args) => security_tools::user(connection, format, args),
        Command::Consume(args) => tools::consume(connection, args),
        Command::Cluster(tools::ClusterArgs { command: None }) => tools::cluster(connection, format),
        Command::Cluster(tools::ClusterArgs { command: Some(tools::ClusterCommand::Health(args)) }) => {
            cluster_health::health(connection, format, args)
        }
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
