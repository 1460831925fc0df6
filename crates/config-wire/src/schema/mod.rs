//! Document-only types (feature `openapi`, for the service's OpenAPI
//! document): how the OpenAPI document describes the bodies that
//! charon-core parses by hand (resources with `kind`, tiers with durations
//! as `"1s"`, overrides, groups, the whole configuration) and the few
//! string sets the wire types carry as plain `String`s.
//!
//! Nothing here is built at run time: core reads these bodies from JSON or
//! YAML values with its field checker (`charon_core::fields`), so its
//! Rust types (parsed durations, `ResourceKind` without a tag) do not have
//! the shape a client sends. These mirror that shape, for the document
//! only; the config service's `tests/config_service/api.rs` and schemathesis hold the two together.
//!
//! Every object in the document is closed (`additionalProperties: false`,
//! added by the service's document builder): core refuses unknown fields in what it reads,
//! and the service sends none. Size bounds (`MAX_TIERS`, …) are stated in
//! descriptions only: as `maxItems` they made schemathesis generate huge
//! bodies for `PUT /v1/config`.

// Described, never constructed or read (so no `Debug`); the derive
// qualifies the public field types it names.
#![allow(dead_code, missing_debug_implementations, unused_qualifications)]

use std::collections::{BTreeMap, BTreeSet};

use utoipa::openapi::schema::{
    AllOfBuilder, AnyOfBuilder, ObjectBuilder, OneOfBuilder, Schema, Type,
};
use utoipa::openapi::{RefOr, schema::Ref};
use utoipa::{PartialSchema, ToSchema};

mod envoy;
pub use envoy::*;

/// The largest count (2^53-1, the largest integer JSON numbers keep).
const MAX_COUNT: u64 = charon_core::MAX_COUNT;

/// Defines named scalar schemas, each `$name: $description = $schema` (an
/// [`ObjectBuilder`] with the bounds the derive cannot put on a scalar);
/// the description is also the type's doc.
macro_rules! scalars {
    ($($name:ident: $description:literal = $schema:expr;)+) => {$(
        #[doc = $description]
        #[derive(PartialEq, Eq, PartialOrd, Ord)]
        pub struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                $schema.description(Some($description)).into()
            }
        }

        impl ToSchema for $name {}
    )+};
}

scalars! {
    Name: "An opaque name: not empty, at most 1024 bytes, no control characters." =
        ObjectBuilder::new().schema_type(Type::String).min_length(Some(1)).max_length(Some(1024));
    Count: "A count or limit, 0 to 2^53-1." =
        ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0)).maximum(Some(MAX_COUNT));
    PositiveCount: "A count of a bucket, window or queue, 1 to 2^53-1 (with the exactness bounds of docs/algorithms.md on top: a full bucket or queue at most 2^53-1 ticks and 2^50 ms; a sliding_counter's limit × window at most 2^53-1)." =
        ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(1)).maximum(Some(MAX_COUNT));
    Capacity: "A capacity of a lease resource: a number from 0 to 9007199254.740991, kept to the millionth (fractions allowed, as in the paper's tables)." =
        ObjectBuilder::new().schema_type(Type::Number).minimum(Some(0)).maximum(Some(9_007_199_254.740_991));
    Version: "A global configuration version." =
        ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0));
    AuditLimit: "How many audit entries a page holds, 1 to 1000." =
        ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(1)).maximum(Some(1000));
    QueueLimit: "The most callers that may wait for a copy of the resource at once, 0 to 1000000 (default 100); a reserve that finds that many waiting is answered queue_full at once." =
        ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0)).maximum(Some(charon_core::copy::MAX_QUEUE_LIMIT));
}

/// `wait_mode` of a copy-limited resource: who a released copy goes to.
/// `exclusive` (default): the first waiter gets it. `shared_result`: every
/// waiter is answered at once, without a copy, that the result is ready.
#[derive(ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitMode {
    Exclusive,
    SharedResult,
}

/// A human duration: `250ms`, `1s`, `15m`, `24h`, `1h 30m` (whole
/// milliseconds). For `active`, also `infinite`.
#[derive(ToSchema)]
#[schema(value_type = String)]
pub struct Duration(String);

/// A burst tier. Read back with every field explicit except an
/// infinite `active`.
#[derive(ToSchema)]
pub struct Tier {
    limit: Count,
    window: Duration,
    /// Omitted or null: infinite.
    active: Option<Duration>,
    /// Default 0s.
    cooldown: Option<Duration>,
    /// Default false.
    skippable: Option<bool>,
}

/// `soft_limit`: a whole percentage above 0% and at most 100%, such as
/// `80%`: replies warn once usage reaches that share of the
/// limit in force.
#[derive(ToSchema)]
#[schema(value_type = String)]
pub struct Percent(String);

/// A per-domain override of a rate-limited resource: replaces H, the
/// whole tier list, the soft limit and/or the ban.
#[derive(ToSchema)]
pub struct RateOverride {
    hard_limit: Option<Count>,
    /// At most 64 tiers (MAX_TIERS); a rate resource holds at most 100000
    /// tiers in all, its own and its overrides' (MAX_TIERS_PER_RESOURCE).
    tiers: Option<Vec<Tier>>,
    soft_limit: Option<Percent>,
    /// Ban a domain this long after a rejection, 1ms to 2^50 ms.
    ban: Option<Duration>,
}

/// A per-domain override of a token bucket: replaces each field it names.
#[derive(ToSchema)]
pub struct BucketOverride {
    burst: Option<PositiveCount>,
    count: Option<PositiveCount>,
    period: Option<Duration>,
    soft_limit: Option<Percent>,
    ban: Option<Duration>,
}

/// `algorithm` of a window.
#[derive(ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WindowAlgorithm {
    Fixed,
    SlidingCounter,
    FirstHit,
}

/// A per-domain override of a window: replaces each field it names.
#[derive(ToSchema)]
pub struct WindowOverride {
    #[schema(inline)]
    algorithm: Option<WindowAlgorithm>,
    limit: Option<PositiveCount>,
    window: Option<Duration>,
    soft_limit: Option<Percent>,
    ban: Option<Duration>,
}

/// A per-domain override of a queue: replaces each field it names.
#[derive(ToSchema)]
pub struct QueueOverride {
    rate: Option<PositiveCount>,
    period: Option<Duration>,
    size: Option<PositiveCount>,
    soft_limit: Option<Percent>,
    ban: Option<Duration>,
}

/// A per-domain override of a copy-limited resource.
#[derive(ToSchema)]
pub struct CopyOverride {
    domain_limit: Count,
}

/// The override of one domain: its shape follows the resource's kind.
/// An `anyOf`: `{}` or an override naming only `soft_limit` or `ban` fits
/// several kinds.
pub struct Override;

impl PartialSchema for Override {
    fn schema() -> RefOr<Schema> {
        AnyOfBuilder::new()
            .description(Some(
                "The override of one domain: its shape follows the resource's kind.",
            ))
            .item(Ref::from_schema_name(RateOverride::name()))
            .item(Ref::from_schema_name(CopyOverride::name()))
            .item(Ref::from_schema_name(BucketOverride::name()))
            .item(Ref::from_schema_name(WindowOverride::name()))
            .item(Ref::from_schema_name(QueueOverride::name()))
            .into()
    }
}

impl ToSchema for Override {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.extend([
            (RateOverride::name().into(), RateOverride::schema()),
            (CopyOverride::name().into(), CopyOverride::schema()),
            (BucketOverride::name().into(), BucketOverride::schema()),
            (WindowOverride::name().into(), WindowOverride::schema()),
            (QueueOverride::name().into(), QueueOverride::schema()),
        ]);
        RateOverride::schemas(schemas);
        BucketOverride::schemas(schemas);
        WindowOverride::schemas(schemas);
        QueueOverride::schemas(schemas);
    }
}

/// A domain group as sent; `name`, if sent, must be the one in the URL.
#[derive(ToSchema)]
pub struct GroupBody {
    name: Option<Name>,
    limit: Count,
    /// At most 10000 memberships over all the groups of a resource
    /// (MAX_GROUP_MEMBERS).
    domains: Option<BTreeSet<Name>>,
}

/// A domain group of a copy-limited resource.
#[derive(ToSchema)]
pub struct Group {
    name: Name,
    limit: Count,
    /// At most 10000 memberships over all the groups of a resource
    /// (MAX_GROUP_MEMBERS).
    domains: Option<BTreeSet<Name>>,
}

/// `kind` of a rate-limited resource.
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RateKind {
    Rate,
}

/// `kind` of a copy-limited resource.
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CopyKind {
    Copy,
}

/// `kind` of a token bucket.
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BucketKind {
    Bucket,
}

/// `kind` of a window.
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WindowKind {
    Window,
}

/// `kind` of a queue.
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum QueueKind {
    Queue,
}

/// `kind` of a lease resource.
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LeaseKind {
    Lease,
}

/// How a lease resource divides its capacity (Doorman's).
#[derive(ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeaseAlgorithm {
    None,
    Static,
    ProportionalShare,
    FairShare,
}

/// A capacity shared as leases: clients ask for a share, hold
/// it for `lease_length`, refresh every `refresh_interval` (at most
/// `lease_length`), and limit themselves locally. No domain overrides.
#[derive(ToSchema)]
pub struct LeaseResource {
    name: Option<Name>,
    #[schema(inline)]
    kind: LeaseKind,
    /// What is handed out in all (per client for `static`).
    capacity: Capacity,
    #[schema(inline)]
    algorithm: LeaseAlgorithm,
    /// 1ms to 2^53-1 ms.
    lease_length: Duration,
    /// 1ms to `lease_length`.
    refresh_interval: Duration,
    /// What a client uses when no server answers (safe mode); omitted:
    /// the capacity divided among the clients holding leases.
    safe_capacity: Option<Capacity>,
    /// How long after a server starts it trusts what clients say they
    /// have; omitted: one lease length; `0s`: off.
    learning_mode: Option<Duration>,
}

/// A rate-limited resource. `name` may be omitted in a PUT
/// body (it comes from the URL).
#[derive(ToSchema)]
pub struct RateResource {
    name: Option<Name>,
    #[schema(inline)]
    kind: RateKind,
    hard_limit: Option<Count>,
    global_limit: Option<Count>,
    /// At most 64 tiers (MAX_TIERS); a rate resource holds at most 100000
    /// tiers in all, its own and its overrides' (MAX_TIERS_PER_RESOURCE).
    tiers: Vec<Tier>,
    /// Warn (`warning: true`) once the current tier's hits reach this
    /// share of its limit.
    soft_limit: Option<Percent>,
    /// Ban a domain this long after a rejection, 1ms to 2^50
    /// ms.
    ban: Option<Duration>,
    /// At most 10000 overrides (MAX_DOMAIN_OVERRIDES).
    domains: Option<BTreeMap<String, RateOverride>>,
}

/// A token bucket, GCRA: `burst` tokens at most, `count` tokens
/// back every `period` (1ms to 2^50 ms), a request's `copies` as its cost.
#[derive(ToSchema)]
pub struct BucketResource {
    name: Option<Name>,
    #[schema(inline)]
    kind: BucketKind,
    burst: PositiveCount,
    count: PositiveCount,
    period: Duration,
    soft_limit: Option<Percent>,
    /// Ban a domain this long after a rejection, 1ms to 2^50 ms.
    ban: Option<Duration>,
    /// At most 10000 overrides (MAX_DOMAIN_OVERRIDES).
    domains: Option<BTreeMap<String, BucketOverride>>,
}

/// A fixed or sliding-counter window: at most `limit` hits per
/// epoch-aligned `window` (1ms to 2^50 ms).
#[derive(ToSchema)]
pub struct WindowResource {
    name: Option<Name>,
    #[schema(inline)]
    kind: WindowKind,
    #[schema(inline)]
    algorithm: WindowAlgorithm,
    limit: PositiveCount,
    window: Duration,
    soft_limit: Option<Percent>,
    /// Ban a domain this long after a rejection, 1ms to 2^50 ms.
    ban: Option<Duration>,
    /// At most 10000 overrides (MAX_DOMAIN_OVERRIDES).
    domains: Option<BTreeMap<String, WindowOverride>>,
}

/// A queue, the leaky bucket that delays: units leave at `rate`
/// per `period` (1ms to 2^50 ms), at most `size` wait.
#[derive(ToSchema)]
pub struct QueueResource {
    name: Option<Name>,
    #[schema(inline)]
    kind: QueueKind,
    rate: PositiveCount,
    period: Duration,
    size: PositiveCount,
    soft_limit: Option<Percent>,
    /// Ban a domain this long after a rejection, 1ms to 2^50 ms.
    ban: Option<Duration>,
    /// At most 10000 overrides (MAX_DOMAIN_OVERRIDES).
    domains: Option<BTreeMap<String, QueueOverride>>,
}

/// A copy-limited resource.
#[derive(ToSchema)]
pub struct CopyResource {
    name: Option<Name>,
    #[schema(inline)]
    kind: CopyKind,
    domain_limit: Count,
    global_limit: Option<Count>,
    queue_limit: Option<QueueLimit>,
    #[schema(inline)]
    wait_mode: Option<WaitMode>,
    /// At most 10000 overrides (MAX_DOMAIN_OVERRIDES).
    domains: Option<BTreeMap<String, CopyOverride>>,
    /// At most 1000 groups (MAX_GROUPS).
    groups: Option<Vec<Group>>,
}

/// A resource of the kind its `kind` says: rate (burst tiers), copy,
/// bucket, window, queue or lease.
#[derive(ToSchema)]
#[serde(untagged)]
#[schema(discriminator(property_name = "kind", mapping(
    ("rate" = "#/components/schemas/RateResource"),
    ("copy" = "#/components/schemas/CopyResource"),
    ("bucket" = "#/components/schemas/BucketResource"),
    ("window" = "#/components/schemas/WindowResource"),
    ("queue" = "#/components/schemas/QueueResource"),
    ("lease" = "#/components/schemas/LeaseResource")
)))]
pub enum Resource {
    Rate(RateResource),
    Copy(CopyResource),
    Bucket(BucketResource),
    Window(WindowResource),
    Queue(QueueResource),
    Lease(LeaseResource),
}

/// A resource to create; its name is required (one of the kinds, with
/// `name` required).
pub struct NewResource;

impl NewResource {
    fn named<T: ToSchema>() -> Schema {
        AllOfBuilder::new()
            .item(Ref::from_schema_name(T::name()))
            .item(
                ObjectBuilder::new()
                    .required("name")
                    .property("name", Ref::from_schema_name(Name::name())),
            )
            .into()
    }
}

impl PartialSchema for NewResource {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .description(Some("A resource to create; its name is required."))
            .item(Self::named::<RateResource>())
            .item(Self::named::<CopyResource>())
            .item(Self::named::<BucketResource>())
            .item(Self::named::<WindowResource>())
            .item(Self::named::<QueueResource>())
            .item(Self::named::<LeaseResource>())
            .into()
    }
}

impl ToSchema for NewResource {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.extend([
            (RateResource::name().into(), RateResource::schema()),
            (CopyResource::name().into(), CopyResource::schema()),
            (BucketResource::name().into(), BucketResource::schema()),
            (WindowResource::name().into(), WindowResource::schema()),
            (QueueResource::name().into(), QueueResource::schema()),
            (LeaseResource::name().into(), LeaseResource::schema()),
        ]);
        RateResource::schemas(schemas);
        CopyResource::schemas(schemas);
        BucketResource::schemas(schemas);
        WindowResource::schemas(schemas);
        QueueResource::schemas(schemas);
        LeaseResource::schemas(schemas);
    }
}

/// A namespace's switches, as sent. Omitted or null: false.
#[derive(ToSchema)]
pub struct NamespaceSettings {
    allow_unconfigured: Option<bool>,
    ignore_configured: Option<bool>,
}

/// The whole configuration, the configuration file's content (as YAML or JSON).
/// Resource names must be unique.
#[derive(ToSchema)]
pub struct ConfigDocument {
    /// At most 10000 namespaces (MAX_NAMESPACES).
    namespaces: Option<BTreeMap<String, NamespaceSettings>>,
    /// At most 100000 resources (MAX_RESOURCES).
    resources: Option<Vec<NewResource>>,
    /// Envoy's rate-limit descriptors; omitted or null: none.
    envoy: Option<EnvoySection>,
}

/// `GET /v1/resources/{name}/domains`.
#[derive(ToSchema)]
pub struct OverrideList {
    version: Version,
    domains: BTreeMap<String, Override>,
}

/// `GET /v1/resources/{name}/groups`.
#[derive(ToSchema)]
pub struct GroupList {
    version: Version,
    groups: Vec<Group>,
}

/// One problem with a request (core's `ConfigIssue`).
#[derive(ToSchema)]
pub struct Problem {
    /// Field path in the body (`tiers[0].window`), a URL parameter name
    /// (`domain`), a header name, or empty for the body as a whole.
    path: String,
    message: String,
}

/// A change normalization made (core's `Adjustment`), at a field path.
#[derive(ToSchema)]
pub struct Adjustment {
    path: String,
    change: String,
}

/// The stable code of an error answer.
#[derive(ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    Invalid,
    Unauthorized,
    Forbidden,
    NotFound,
    AlreadyExists,
    WrongKind,
    VersionConflict,
    UnsupportedMediaType,
    PayloadTooLarge,
    MethodNotAllowed,
    Unavailable,
    Internal,
}

/// What a difference entry is about: a resource, a namespace, or the
/// whole `envoy:` section (named `envoy`).
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiffKind {
    Resource,
    Namespace,
    Envoy,
}

/// What a difference entry does.
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiffOp {
    Add,
    Change,
    Remove,
}

/// How `GET /v1/config` writes the configuration.
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    Json,
    Yaml,
}
