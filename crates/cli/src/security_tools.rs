//! `sluice acl` and `sluice user`: ACLs and SCRAM users over the Kafka protocol
//! (CreateAcls/DescribeAcls/DeleteAcls, Describe/AlterUserScramCredentials), as
//! `kafka-acls.sh` and `kafka-configs.sh --entity-type users` do. librdkafka has no API for
//! these, so they speak the protocol directly (`kafka_connection`), over any listener:
//! `-X security.protocol=...` and the `ssl.*` and `sasl.*` settings say how.
//!
//! A password is never needed on the command line, where other users see it (`ps`) and the
//! shell keeps it: `sluice user add` reads the new one from a file, the environment, a
//! prompt or standard input.

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use bytes::Bytes;
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, ApiKey, CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest,
    DescribeUserScramCredentialsRequest, RequestKind, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;

use serde::Serialize;

use crate::kafka_connection::{ConnectionArgs, Connector};
use crate::output::{count, Format, TextTable};

const ACLS_VERSION: i16 = 3;
const SCRAM_VERSION: i16 = 0;
/// Iterations `sluice user add` uses unless told otherwise (Kafka's tools use 4096).
pub const SCRAM_ITERATIONS_DEFAULT: i32 = 8192;

/// `Err("what: the broker's words")` unless `error_code` is 0.
pub(crate) fn check(error_code: i16, message: Option<&StrBytes>, what: &str) -> anyhow::Result<()> {
    sluice_client::check(error_code, message.map(|m| m.as_str()), what)
}

/// Where `sluice user add` reads the new password when no `--password-file` is given.
pub const USER_PASSWORD_ENV: &str = "SLUICE_USER_PASSWORD";

#[derive(Serialize)]
struct AclView {
    principal: String,
    host: String,
    resource_type: &'static str,
    resource_name: String,
    pattern: &'static str,
    operation: String,
    permission: &'static str,
}

#[derive(Serialize)]
struct UserView {
    name: String,
    mechanism: &'static str,
    iterations: i32,
}

/// Which resources an ACL names.
#[derive(Debug, Clone, clap::Args)]
pub struct Resource {
    #[arg(long, group = "resource")]
    topic: Option<String>,
    #[arg(long, group = "resource")]
    group: Option<String>,
    #[arg(long, group = "resource")]
    transactional_id: Option<String>,
    /// The cluster itself (for ALTER, DESCRIBE, CLUSTER_ACTION, IDEMPOTENT_WRITE ...).
    #[arg(long, group = "resource")]
    cluster: bool,
    /// The name is a prefix (PREFIXED pattern) instead of a literal name.
    #[arg(long)]
    prefixed: bool,
}

impl Resource {
    /// (resource type, name) or `None` when none was named.
    fn named(&self) -> Option<(i8, String)> {
        match (&self.topic, &self.group, &self.transactional_id, self.cluster) {
            (Some(t), _, _, _) => Some((2, t.clone())),
            (_, Some(g), _, _) => Some((3, g.clone())),
            (_, _, Some(t), _) => Some((5, t.clone())),
            (_, _, _, true) => Some((4, "kafka-cluster".into())),
            _ => None,
        }
    }

    fn pattern(&self) -> i8 {
        if self.prefixed {
            4
        } else {
            3
        }
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum AclCommand {
    /// List ACLs (all, or those of one resource and/or principal).
    List {
        #[command(flatten)]
        resource: Resource,
        #[arg(long)]
        principal: Option<String>,
    },
    /// Add an ACL: --allow or --deny, a principal (User:alice), operations, a resource.
    Add {
        #[command(flatten)]
        resource: Resource,
        #[arg(long, conflicts_with = "deny")]
        allow: bool,
        #[arg(long)]
        deny: bool,
        #[arg(long)]
        principal: String,
        /// READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS,
        /// ALTER_CONFIGS, IDEMPOTENT_WRITE or ALL; repeatable.
        #[arg(long = "operation", required = true)]
        operations: Vec<String>,
        #[arg(long, default_value = "*")]
        host: String,
    },
    /// Remove the ACLs of a resource (optionally only a principal's).
    Remove {
        #[command(flatten)]
        resource: Resource,
        #[arg(long)]
        principal: Option<String>,
    },
}

#[derive(Debug, clap::Args)]
pub struct AclArgs {
    #[command(subcommand)]
    command: AclCommand,
}

const OPERATIONS: &[(&str, i8)] = &[
    ("ALL", 2),
    ("READ", 3),
    ("WRITE", 4),
    ("CREATE", 5),
    ("DELETE", 6),
    ("ALTER", 7),
    ("DESCRIBE", 8),
    ("CLUSTER_ACTION", 9),
    ("DESCRIBE_CONFIGS", 10),
    ("ALTER_CONFIGS", 11),
    ("IDEMPOTENT_WRITE", 12),
];

fn operation_code(name: &str) -> anyhow::Result<i8> {
    let wanted = name.trim().to_ascii_uppercase().replace('-', "_");
    OPERATIONS
        .iter()
        .find(|(n, _)| *n == wanted)
        .map(|(_, c)| *c)
        .with_context(|| format!("unknown operation {name:?}"))
}

fn operation_name(code: i8) -> String {
    OPERATIONS.iter().find(|(_, c)| *c == code).map_or(code.to_string(), |(n, _)| n.to_string())
}

fn resource_type_name(code: i8) -> &'static str {
    match code {
        2 => "TOPIC",
        3 => "GROUP",
        4 => "CLUSTER",
        5 => "TRANSACTIONAL_ID",
        6 => "DELEGATION_TOKEN",
        7 => "USER",
        _ => "UNKNOWN",
    }
}

pub fn acl(connection: &ConnectionArgs, format: Format, args: AclArgs) -> anyhow::Result<()> {
    let connector = connection.connector()?;
    let call = |api_key, version, body| connector.call(connection.bootstrap(), api_key, version, body);
    match args.command {
        AclCommand::List { resource, principal } => {
            let mut request = DescribeAclsRequest::default();
            let (resource_type, name) = resource.named().map_or((1, None), |(t, n)| (t, Some(n)));
            request.resource_type_filter = resource_type;
            request.resource_name_filter = name.map(StrBytes::from_string);
            request.pattern_type_filter = if resource.named().is_some() { resource.pattern() } else { 1 };
            request.principal_filter = principal.map(StrBytes::from_string);
            request.host_filter = None;
            request.operation = 1;
            request.permission_type = 1;
            let ResponseKind::DescribeAcls(response) =
                call(ApiKey::DescribeAcls, ACLS_VERSION, RequestKind::DescribeAcls(request))?
            else {
                bail!("unexpected answer");
            };
            check(response.error_code, response.error_message.as_ref(), "listing ACLs")?;
            let mut acls = Vec::new();
            for resource in response.resources {
                let pattern = if resource.pattern_type == 4 { "PREFIXED" } else { "LITERAL" };
                for acl in resource.acls {
                    acls.push(AclView {
                        resource_type: resource_type_name(resource.resource_type),
                        resource_name: resource.resource_name.to_string(),
                        pattern,
                        principal: acl.principal.to_string(),
                        host: acl.host.to_string(),
                        operation: operation_name(acl.operation),
                        permission: if acl.permission_type == 2 { "DENY" } else { "ALLOW" },
                    });
                }
            }
            if format.document(&acls)? {
                return Ok(());
            }
            let mut table = TextTable::new(&[
                "PRINCIPAL",
                "HOST",
                "RESOURCE-TYPE",
                "RESOURCE-NAME",
                "PATTERN",
                "OPERATION",
                "PERMISSION",
            ]);
            for acl in &acls {
                table.row([
                    acl.principal.as_str(),
                    acl.host.as_str(),
                    acl.resource_type,
                    acl.resource_name.as_str(),
                    acl.pattern,
                    acl.operation.as_str(),
                    acl.permission,
                ]);
            }
            table.print();
        }
        AclCommand::Add { resource, allow, deny, principal, operations, host } => {
            let Some((resource_type, name)) = resource.named() else {
                bail!("name a resource: --topic, --group, --transactional-id or --cluster");
            };
            if allow == deny {
                bail!("say --allow or --deny");
            }
            let mut request = CreateAclsRequest::default();
            for operation in &operations {
                let mut creation = AclCreation::default();
                creation.resource_type = resource_type;
                creation.resource_name = StrBytes::from_string(name.clone());
                creation.resource_pattern_type = resource.pattern();
                creation.principal = StrBytes::from_string(principal.clone());
                creation.host = StrBytes::from_string(host.clone());
                creation.operation = operation_code(operation)?;
                creation.permission_type = if deny { 2 } else { 3 };
                request.creations.push(creation);
            }
            let ResponseKind::CreateAcls(response) =
                call(ApiKey::CreateAcls, ACLS_VERSION, RequestKind::CreateAcls(request))?
            else {
                bail!("unexpected answer");
            };
            for (result, operation) in response.results.iter().zip(&operations) {
                let what = format!(
                    "adding ACL {} on {} {name}",
                    operation.to_ascii_uppercase(),
                    resource_type_name(resource_type)
                );
                check(result.error_code, result.error_message.as_ref(), &what)?;
            }
            println!("added {} on {} {name}", count(operations.len(), "ACL"), resource_type_name(resource_type));
        }
        AclCommand::Remove { resource, principal } => {
            let Some((resource_type, name)) = resource.named() else {
                bail!("name a resource: --topic, --group, --transactional-id or --cluster");
            };
            let mut filter = DeleteAclsFilter::default();
            filter.resource_type_filter = resource_type;
            filter.resource_name_filter = Some(StrBytes::from_string(name.clone()));
            filter.pattern_type_filter = resource.pattern();
            filter.principal_filter = principal.map(StrBytes::from_string);
            filter.host_filter = None;
            filter.operation = 1;
            filter.permission_type = 1;
            let mut request = DeleteAclsRequest::default();
            request.filters.push(filter);
            let ResponseKind::DeleteAcls(response) =
                call(ApiKey::DeleteAcls, ACLS_VERSION, RequestKind::DeleteAcls(request))?
            else {
                bail!("unexpected answer");
            };
            for result in &response.filter_results {
                check(result.error_code, result.error_message.as_ref(), "removing ACLs")?;
                println!(
                    "removed {} on {} {name}",
                    count(result.matching_acls.len(), "ACL"),
                    resource_type_name(resource_type)
                );
            }
        }
    }
    Ok(())
}

#[derive(Debug, clap::Subcommand)]
pub enum UserCommand {
    /// List SCRAM users with their mechanisms and iterations.
    List,
    /// Add a SCRAM user or change its password. The password is read from --password-file,
    /// else $SLUICE_USER_PASSWORD, else a prompt (on a terminal) or a line of standard input.
    Add {
        name: String,
        /// A file whose first line is the password.
        #[arg(long, value_name = "PATH")]
        password_file: Option<PathBuf>,
        /// Visible to other users and kept in shell history: use --password-file instead.
        #[arg(long, hide = true, conflicts_with = "password_file")]
        password: Option<String>,
        /// SCRAM-SHA-256 or SCRAM-SHA-512.
        #[arg(long, default_value = "SCRAM-SHA-512")]
        mechanism: String,
        #[arg(long, default_value_t = SCRAM_ITERATIONS_DEFAULT)]
        iterations: i32,
    },
    /// Delete a SCRAM user's credential (one mechanism).
    Delete {
        name: String,
        #[arg(long, default_value = "SCRAM-SHA-512")]
        mechanism: String,
    },
}

#[derive(Debug, clap::Args)]
pub struct UserArgs {
    #[command(subcommand)]
    command: UserCommand,
}

fn mechanism_code(name: &str) -> anyhow::Result<i8> {
    match name.to_ascii_uppercase().as_str() {
        "SCRAM-SHA-256" => Ok(1),
        "SCRAM-SHA-512" => Ok(2),
        other => bail!("unknown SCRAM mechanism {other:?} (SCRAM-SHA-256, SCRAM-SHA-512)"),
    }
}

/// PBKDF2 of the password, as the client side of AlterUserScramCredentials sends it.
fn salted_password(mechanism: i8, password: &str, salt: &[u8], iterations: i32) -> Vec<u8> {
    let rounds = u32::try_from(iterations).unwrap_or(0);
    if mechanism == 1 {
        let mut out = vec![0u8; 32];
        pbkdf2::pbkdf2_hmac::<sha2::Sha256>(password.as_bytes(), salt, rounds, &mut out);
        out
    } else {
        let mut out = vec![0u8; 64];
        pbkdf2::pbkdf2_hmac::<sha2::Sha512>(password.as_bytes(), salt, rounds, &mut out);
        out
    }
}

pub fn user(connection: &ConnectionArgs, format: Format, args: UserArgs) -> anyhow::Result<()> {
    let bootstrap = connection.bootstrap();
    match args.command {
        UserCommand::List => {
            let request = DescribeUserScramCredentialsRequest::default();
            let ResponseKind::DescribeUserScramCredentials(response) = connection.connector()?.call(
                bootstrap,
                ApiKey::DescribeUserScramCredentials,
                SCRAM_VERSION,
                RequestKind::DescribeUserScramCredentials(request),
            )?
            else {
                bail!("unexpected answer");
            };
            check(response.error_code, response.error_message.as_ref(), "listing users")?;
            let mut users = Vec::new();
            for result in response.results {
                check(result.error_code, result.error_message.as_ref(), &format!("user {}", result.user))?;
                for credential in &result.credential_infos {
                    let mechanism = if credential.mechanism == 1 { "SCRAM-SHA-256" } else { "SCRAM-SHA-512" };
                    users.push(UserView {
                        name: result.user.to_string(),
                        mechanism,
                        iterations: credential.iterations,
                    });
                }
            }
            if format.document(&users)? {
                return Ok(());
            }
            let mut table = TextTable::new(&["NAME", "MECHANISM", "ITERATIONS"]).numeric(&["ITERATIONS"]);
            for user in &users {
                table.row([user.name.clone(), user.mechanism.to_string(), user.iterations.to_string()]);
            }
            table.print();
        }
        UserCommand::Add { name, password_file, password, mechanism, iterations } => {
            let code = mechanism_code(&mechanism)?;
            // The connection's settings first: a mistake there should not cost a prompt.
            let connector = connection.connector()?;
            let password = new_password(&name, password_file.as_deref(), password)?;
            let salt: [u8; 32] = rand::random();
            let mut upsertion = ScramCredentialUpsertion::default();
            upsertion.name = StrBytes::from_string(name.clone());
            upsertion.mechanism = code;
            upsertion.iterations = iterations;
            upsertion.salt = Bytes::copy_from_slice(&salt);
            upsertion.salted_password = Bytes::from(salted_password(code, &password, &salt, iterations));
            let mut request = AlterUserScramCredentialsRequest::default();
            request.upsertions.push(upsertion);
            alter_users(&connector, bootstrap, request, &format!("added {mechanism} credential for {name}"))?;
        }
        UserCommand::Delete { name, mechanism } => {
            let mut deletion = ScramCredentialDeletion::default();
            deletion.name = StrBytes::from_string(name.clone());
            deletion.mechanism = mechanism_code(&mechanism)?;
            let mut request = AlterUserScramCredentialsRequest::default();
            request.deletions.push(deletion);
            let connector = connection.connector()?;
            alter_users(&connector, bootstrap, request, &format!("deleted {mechanism} credential of {name}"))?;
        }
    }
    Ok(())
}

fn alter_users(
    connector: &Connector,
    bootstrap: &str,
    request: AlterUserScramCredentialsRequest,
    done: &str,
) -> anyhow::Result<()> {
    let ResponseKind::AlterUserScramCredentials(response) = connector.call(
        bootstrap,
        ApiKey::AlterUserScramCredentials,
        SCRAM_VERSION,
        RequestKind::AlterUserScramCredentials(request),
    )?
    else {
        bail!("unexpected answer");
    };
    for result in &response.results {
        check(result.error_code, result.error_message.as_ref(), &format!("user {}", result.user))?;
    }
    println!("{done}");
    Ok(())
}

/// The new password of `user`: --password-file, else $SLUICE_USER_PASSWORD, else asked for
/// (twice, without echo) on a terminal, else the first line of standard input.
fn new_password(user: &str, file: Option<&Path>, given: Option<String>) -> anyhow::Result<String> {
    let password = if let Some(password) = given {
        eprintln!("warning: --password is visible to other users of this machine; use --password-file");
        password
    } else if let Some(path) = file {
        let text = std::fs::read_to_string(path).with_context(|| format!("--password-file {}", path.display()))?;
        first_line(&text).to_string()
    } else if let Some(password) = std::env::var(USER_PASSWORD_ENV).ok().filter(|p| !p.is_empty()) {
        password
    } else if std::io::stdin().is_terminal() {
        prompt_twice(user)?
    } else {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).context("reading the password from standard input")?;
        first_line(&line).to_string()
    };
    if password.is_empty() {
        bail!("the password of {user} is empty");
    }
    Ok(password)
}

fn prompt_twice(user: &str) -> anyhow::Result<String> {
    let password = rpassword::prompt_password(format!("New password of {user}: "))?;
    let again = rpassword::prompt_password(format!("New password of {user} again: "))?;
    if password != again {
        bail!("the two passwords differ");
    }
    Ok(password)
}

/// `text` up to its first line break (a password file ends with one, or not).
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}
