//! `sluice schema`: the Schema Registry from the command line (register, list, show,
//! check compatibility, delete, levels and modes), over its REST API at `--registry`
//! (any node; writes are forwarded to the one leading `_schemas`). Errors print the
//! registry's own code and message.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

/// How long one registry call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

#[derive(Debug, clap::Args)]
pub struct SchemaArgs {
    /// The registry's URL.
    #[arg(long, global = true, env = "SLUICE_SCHEMA_REGISTRY", default_value = "http://127.0.0.1:8081")]
    registry: String,
    /// USER:PASSWORD for HTTP basic authentication (a SASL user of the cluster).
    #[arg(long, global = true, env = "SLUICE_SCHEMA_REGISTRY_AUTH", hide_env_values = true)]
    auth: Option<String>,
    #[command(subcommand)]
    command: SchemaCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum SchemaCommand {
    /// Register the schema in FILE under SUBJECT; prints its id.
    Register {
        subject: String,
        /// The schema's file (`-`: stdin).
        file: PathBuf,
        /// AVRO (default) or JSON.
        #[arg(long = "type", default_value = "AVRO")]
        schema_type: String,
        /// A reference: NAME=SUBJECT:VERSION (repeatable).
        #[arg(long = "reference")]
        references: Vec<String>,
    },
    /// List subjects.
    List {
        /// Include soft-deleted subjects.
        #[arg(long)]
        deleted: bool,
        /// Only subjects starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
    },
    /// Show a subject's versions, one version (`--version`), or a schema by id (`--id`).
    Get {
        /// The subject (not with --id).
        subject: Option<String>,
        /// A version number or `latest`.
        #[arg(long)]
        version: Option<String>,
        #[arg(long, conflicts_with_all = ["subject", "version"])]
        id: Option<i32>,
    },
    /// Check the schema in FILE against SUBJECT's versions as its level says (or against
    /// one `--version`); exits 1 when it is incompatible.
    Check {
        subject: String,
        file: PathBuf,
        #[arg(long = "type", default_value = "AVRO")]
        schema_type: String,
        #[arg(long)]
        version: Option<String>,
    },
    /// Soft-delete a subject, or one `--version`; `--permanent` removes what was soft-deleted.
    Delete {
        subject: String,
        #[arg(long)]
        version: Option<String>,
        #[arg(long)]
        permanent: bool,
    },
    /// Show or `--set` the compatibility level of SUBJECT (or of the registry).
    Compatibility {
        subject: Option<String>,
        /// BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE, FULL, FULL_TRANSITIVE or NONE.
        #[arg(long)]
        set: Option<String>,
    },
    /// Show or `--set` the mode of SUBJECT (or of the registry).
    Mode {
        subject: Option<String>,
        /// READWRITE, READONLY or IMPORT.
        #[arg(long)]
        set: Option<String>,
    },
}

pub fn schema(args: SchemaArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client = Client::new(&args)?;
    runtime.block_on(run(&client, args.command))
}

async fn run(client: &Client, command: SchemaCommand) -> anyhow::Result<()> {
    match command {
        SchemaCommand::Register { subject, file, schema_type, references } => {
            let body = schema_body(&file, &schema_type, &references)?;
            let answer = client.call("POST", &format!("/subjects/{}/versions", path(&subject)), Some(body)).await?;
            println!("registered {subject}: id {}", answer["id"]);
        }
        SchemaCommand::List { deleted, prefix } => {
            let query = format!("/subjects?deleted={deleted}&subjectPrefix={}", path(&prefix));
            for subject in client.call("GET", &query, None).await?.as_array().into_iter().flatten() {
                println!("{}", subject.as_str().unwrap_or_default());
            }
        }
        SchemaCommand::Get { subject, version, id } => get(client, subject, version, id).await?,
        SchemaCommand::Check { subject, file, schema_type, version } => {
            let body = schema_body(&file, &schema_type, &[])?;
            let at = match &version {
                Some(version) => format!("/versions/{}", path(version)),
                None => "/versions".to_string(),
            };
            let query = format!("/compatibility/subjects/{}{at}?verbose=true", path(&subject));
            let answer = client.call("POST", &query, Some(body)).await?;
            if answer["is_compatible"] == json!(true) {
                println!("compatible");
            } else {
                let reasons: Vec<String> = answer["messages"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|m| m.as_str().unwrap_or_default().to_string())
                    .collect();
                bail!("incompatible with {subject}: {}", reasons.join("; "));
            }
        }
        SchemaCommand::Delete { subject, version, permanent } => {
            let target = match &version {
                Some(version) => format!("/subjects/{}/versions/{}", path(&subject), path(version)),
                None => format!("/subjects/{}", path(&subject)),
            };
            let answer = client.call("DELETE", &format!("{target}?permanent={permanent}"), None).await?;
            let how = if permanent { "permanently deleted" } else { "soft-deleted" };
            println!("{how} {subject} version(s) {}", versions_text(&answer));
        }
        SchemaCommand::Compatibility { subject, set } => {
            setting(client, "/config", subject, set.map(|level| json!({"compatibility": level}))).await?;
        }
        SchemaCommand::Mode { subject, set } => {
            setting(client, "/mode", subject, set.map(|mode| json!({"mode": mode}))).await?;
        }
    }
    Ok(())
}

async fn get(client: &Client, subject: Option<String>, version: Option<String>, id: Option<i32>) -> anyhow::Result<()> {
    match (subject, id) {
        (None, Some(id)) => {
            let answer = client.call("GET", &format!("/schemas/ids/{id}"), None).await?;
            let subjects = client.call("GET", &format!("/schemas/ids/{id}/versions"), None).await?;
            let used: Vec<String> = subjects
                .as_array()
                .into_iter()
                .flatten()
                .map(|pair| format!("{} v{}", pair["subject"].as_str().unwrap_or_default(), pair["version"]))
                .collect();
            println!("id {id}  type {}  used by {}", answer["schemaType"].as_str().unwrap_or("AVRO"), used.join(", "));
            println!("{}", text(&answer["schema"]));
        }
        (Some(subject), None) => match version {
            None => {
                let answer = client.call("GET", &format!("/subjects/{}/versions", path(&subject)), None).await?;
                println!("{subject}: version(s) {}", versions_text(&answer));
            }
            Some(version) => {
                let at = format!("/subjects/{}/versions/{}", path(&subject), path(&version));
                let answer = client.call("GET", &at, None).await?;
                println!(
                    "{subject} version {}  id {}  type {}",
                    answer["version"],
                    answer["id"],
                    answer["schemaType"].as_str().unwrap_or("AVRO")
                );
                println!("{}", text(&answer["schema"]));
            }
        },
        _ => bail!("name a subject, or give --id"),
    }
    Ok(())
}

/// Shows a config or mode (`/config` or `/mode`), or sets it when `update` is given.
async fn setting(client: &Client, base: &str, subject: Option<String>, update: Option<Value>) -> anyhow::Result<()> {
    let at = match &subject {
        Some(subject) => format!("{base}/{}", path(subject)),
        None => base.to_string(),
    };
    let whose = subject.as_deref().unwrap_or("the registry");
    match update {
        Some(body) => {
            let answer = client.call("PUT", &at, Some(body)).await?;
            println!("{whose}: {}", first_string(&answer));
        }
        None => {
            let query = if subject.is_some() { format!("{at}?defaultToGlobal=true") } else { at };
            println!("{whose}: {}", first_string(&client.call("GET", &query, None).await?));
        }
    }
    Ok(())
}

fn first_string(answer: &Value) -> String {
    answer.as_object().and_then(|o| o.values().next()).and_then(Value::as_str).unwrap_or_default().to_string()
}

fn versions_text(answer: &Value) -> String {
    match answer {
        Value::Array(versions) => versions.iter().map(Value::to_string).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// A schema's text as registered.
fn text(schema: &Value) -> &str {
    schema.as_str().unwrap_or_default()
}

/// A path segment, percent-encoded.
fn path(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// The body of a registration or check: the file's schema, its type and references.
fn schema_body(file: &PathBuf, schema_type: &str, references: &[String]) -> anyhow::Result<Value> {
    let schema = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the schema from stdin")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let references = references
        .iter()
        .map(|reference| {
            let parsed = reference.split_once('=').and_then(|(name, target)| {
                let (subject, version) = target.rsplit_once(':')?;
                Some(json!({"name": name, "subject": subject, "version": version.parse::<i32>().ok()?}))
            });
            parsed.with_context(|| format!("--reference {reference:?}: expected NAME=SUBJECT:VERSION"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(json!({"schema": schema, "schemaType": schema_type.to_ascii_uppercase(), "references": references}))
}

struct Client {
    http: reqwest::Client,
    base: String,
    auth: Option<(String, String)>,
}

impl Client {
    fn new(args: &SchemaArgs) -> anyhow::Result<Client> {
        // The registry may be https://: rustls with ring, as the listeners use.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder().timeout(CALL_TIMEOUT).build().context("HTTP client")?;
        let auth = match &args.auth {
            Some(pair) => {
                let (user, password) = pair.split_once(':').context("--auth: expected USER:PASSWORD")?;
                Some((user.to_string(), password.to_string()))
            }
            None => None,
        };
        Ok(Client { http, base: args.registry.trim_end_matches('/').to_string(), auth })
    }

    /// One call: the JSON answer, or the registry's error as `error CODE: message`.
    async fn call(&self, method: &str, at: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let url = format!("{}{at}", self.base);
        let method = reqwest::Method::from_bytes(method.as_bytes())?;
        let mut request = self.http.request(method, &url).header("Accept", CONTENT_TYPE);
        if let Some((user, password)) = &self.auth {
            request = request.basic_auth(user, Some(password));
        }
        if let Some(body) = body {
            request = request.header("Content-Type", CONTENT_TYPE).body(body.to_string());
        }
        let answer =
            request.send().await.with_context(|| format!("cannot reach the schema registry at {}", self.base))?;
        let status = answer.status();
        let text = answer.text().await.context("reading the registry's answer")?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            match (value.get("error_code"), value.get("message").and_then(Value::as_str)) {
                (Some(code), Some(message)) => bail!("{message} (error {code})"),
                _ => bail!("HTTP {status}: {value}"),
            }
        }
        Ok(value)
    }
}
