//! DescribeClientQuotas and AlterClientQuotas (KIP-546): what `kafka-configs.sh
//! --entity-type users|clients --alter --add-config producer_byte_rate=...` sends. The
//! quotas are enforced by `sluice_security::quota`; describing needs DESCRIBE_CONFIGS on
//! the cluster, altering ALTER_CONFIGS (`sluice_security::acl`).

use std::collections::BTreeMap;

use kafka_protocol::messages::alter_client_quotas_response as alter_response;
use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest, DescribeClientQuotasResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_cluster::{QuotaEntity, QuotaEntityName};
use sluice_security::acl;
use sluice_security::quota::{CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE};

use super::{message, ClientSession};
use crate::Broker;

const ENTITY_USER: &str = "user";
const ENTITY_CLIENT_ID: &str = "client-id";
const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;
const MATCH_ANY: i8 = 2;

fn entity_name(name: &Option<QuotaEntityName>) -> Option<StrBytes> {
    match name {
        Some(QuotaEntityName::Named(name)) => Some(StrBytes::from_string(name.clone())),
        _ => None,
    }
}

/// The entity's components as Kafka lists them: (type, name; `None` = default).
fn components(entity: &QuotaEntity) -> Vec<(&'static str, Option<StrBytes>)> {
    let mut parts = Vec::new();
    if entity.user.is_some() {
        parts.push((ENTITY_USER, entity_name(&entity.user)));
    }
    if entity.client_id.is_some() {
        parts.push((ENTITY_CLIENT_ID, entity_name(&entity.client_id)));
    }
    parts
}

pub(super) fn describe(
    broker: &Broker,
    session: &ClientSession,
    request: DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    let mut response = DescribeClientQuotasResponse::default();
    if !broker.authorized_on_cluster(session, acl::OP_DESCRIBE_CONFIGS) {
        response.error_code = ResponseError::ClusterAuthorizationFailed.code();
        response.error_message = message("Cluster authorization failed.");
        return response;
    }
    let mut filters = BTreeMap::new();
    for component in &request.components {
        let entity_type = component.entity_type.to_string();
        if entity_type != ENTITY_USER && entity_type != ENTITY_CLIENT_ID {
            response.error_code = ResponseError::InvalidRequest.code();
            response.error_message =
                message(format!("Unsupported quota entity type {entity_type:?} (user, client-id)"));
            return response;
        }
        let wanted = match component.match_type {
            MATCH_EXACT => match &component._match {
                Some(name) => Some(QuotaEntityName::Named(name.to_string())),
                None => {
                    response.error_code = ResponseError::InvalidRequest.code();
                    response.error_message = message("An exact match needs a name");
                    return response;
                }
            },
            MATCH_DEFAULT => Some(QuotaEntityName::Default),
            MATCH_ANY => None,
            other => {
                response.error_code = ResponseError::InvalidRequest.code();
                response.error_message = message(format!("Unknown match type {other}"));
                return response;
            }
        };
        if filters.insert(entity_type.clone(), wanted).is_some() {
            response.error_code = ResponseError::InvalidRequest.code();
            response.error_message = message(format!("Duplicate filter component for {entity_type}"));
            return response;
        }
    }
    let matches = |wanted: Option<&Option<QuotaEntityName>>, actual: &Option<QuotaEntityName>| match wanted {
        None => !request.strict || actual.is_none(),
        Some(None) => actual.is_some(),
        Some(Some(name)) => actual.as_ref() == Some(name),
    };
    let mut entries = Vec::new();
    broker.with_client_quotas(|quotas| {
        for (entity, values) in quotas {
            if !matches(filters.get(ENTITY_USER), &entity.user)
                || !matches(filters.get(ENTITY_CLIENT_ID), &entity.client_id)
            {
                continue;
            }
            let mut entry = EntryData::default();
            for (entity_type, name) in components(entity) {
                let mut data = EntityData::default();
                data.entity_type = StrBytes::from_static_str(entity_type);
                data.entity_name = name;
                entry.entity.push(data);
            }
            for (key, value) in values {
                let mut data = ValueData::default();
                data.key = StrBytes::from_string(key.clone());
                data.value = *value as f64;
                entry.values.push(data);
            }
            entries.push(entry);
        }
    });
    response.entries = Some(entries);
    response
}

/// Reads one entry's entity; the error says what is wrong with it.
fn parse_entity(
    entity: &[kafka_protocol::messages::alter_client_quotas_request::EntityData],
) -> Result<QuotaEntity, String> {
    let mut parsed = QuotaEntity { user: None, client_id: None };
    for component in entity {
        let name = match &component.entity_name {
            Some(name) => QuotaEntityName::Named(name.to_string()),
            None => QuotaEntityName::Default,
        };
        let slot = match component.entity_type.as_str() {
            ENTITY_USER => &mut parsed.user,
            ENTITY_CLIENT_ID => &mut parsed.client_id,
            other => return Err(format!("Unsupported quota entity type {other:?} (user, client-id)")),
        };
        if slot.replace(name).is_some() {
            return Err(format!("Duplicate entity type {}", component.entity_type));
        }
    }
    if parsed.user.is_none() && parsed.client_id.is_none() {
        return Err("The quota entity is empty".into());
    }
    Ok(parsed)
}

pub(super) async fn alter(
    broker: &Broker,
    session: &ClientSession,
    request: AlterClientQuotasRequest,
) -> AlterClientQuotasResponse {
    let allowed = broker.authorized_on_cluster(session, acl::OP_ALTER_CONFIGS);
    let mut response = AlterClientQuotasResponse::default();
    let mut changes = Vec::new();
    let mut accepted = Vec::new();
    for entry in request.entries {
        let mut result = alter_response::EntryData::default();
        result.entity = entry
            .entity
            .iter()
            .map(|e| {
                let mut data = alter_response::EntityData::default();
                data.entity_type = e.entity_type.clone();
                data.entity_name = e.entity_name.clone();
                data
            })
            .collect();
        let parsed = if allowed {
            parse_entity(&entry.entity).map_err(|text| (ResponseError::InvalidRequest, text)).and_then(|entity| {
                let mut ops = Vec::new();
                for op in &entry.ops {
                    let key = op.key.to_string();
                    if ![PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE].contains(&key.as_str()) {
                        let text = format!(
                            "Quota {key:?} is not supported (Sluice enforces {PRODUCER_BYTE_RATE}, \
                             {CONSUMER_BYTE_RATE} and {REQUEST_PERCENTAGE})"
                        );
                        return Err((ResponseError::InvalidRequest, text));
                    }
                    let value = if op.remove {
                        None
                    } else if op.value.is_finite() && op.value >= 0.0 && op.value < u64::MAX as f64 {
                        Some(op.value as u64)
                    } else {
                        return Err((ResponseError::InvalidRequest, format!("Invalid value {} for {key}", op.value)));
                    };
                    // Stored as whole numbers (the replicated metadata keeps integers).
                    if key == REQUEST_PERCENTAGE && value.is_some() && op.value.fract() != 0.0 {
                        let text = format!("{REQUEST_PERCENTAGE} must be a whole number of percent, got {}", op.value);
                        return Err((ResponseError::InvalidRequest, text));
                    }
                    ops.push((entity.clone(), key, value));
                }
                Ok(ops)
            })
        } else {
            Err((ResponseError::ClusterAuthorizationFailed, "Cluster authorization failed.".to_string()))
        };
        match parsed {
            Ok(ops) => {
                changes.extend(ops);
                accepted.push(response.entries.len());
            }
            Err((error, text)) => {
                result.error_code = error.code();
                result.error_message = message(text);
            }
        }
        response.entries.push(result);
    }
    if !request.validate_only && !changes.is_empty() {
        if let Err((error, text)) = broker.alter_client_quotas(changes).await {
            for index in accepted {
                response.entries[index].error_code = error.code();
                response.entries[index].error_message = message(text.clone());
            }
        }
    }
    response
}
