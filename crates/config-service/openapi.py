#!/usr/bin/env python3
"""Generates openapi.json, the OpenAPI document of the configuration service.

The document is committed (the service serves it with include_str!); edit
this file, then run:  python3 openapi.py > openapi.json
Conformance with the API is checked by tests/schemathesis.sh and by
tests/api.rs (every documented operation is served)."""
import json
R = lambda n: {"$ref": f"#/components/schemas/{n}"}
def resp(desc, schema=None, etag=True, ctypes=("application/json",)):
    r = {"description": desc}
    if schema is not None:
        r["content"] = {c: {"schema": schema} for c in ctypes}
    if etag:
        r["headers"] = {"ETag": {"$ref": "#/components/headers/ETag"}}
    return r
def err(code):
    return {"$ref": f"#/components/responses/{code}"}

MAX = 9007199254740991
schemas = {
 "Name": {"type": "string", "minLength": 1, "maxLength": 1024,
          "description": "An opaque name: not empty, at most 1024 bytes, no control characters."},
 "Count": {"type": "integer", "minimum": 0, "maximum": MAX, "description": "A count or limit, 0 to 2^53-1."},
 "Duration": {"type": "string", "description": "A human duration: 250ms, 1s, 15m, 24h, 1h 30m (whole milliseconds). For `active`, also `infinite`."},
 "Tier": {"type": "object", "additionalProperties": False, "required": ["limit", "window"],
   "description": "A burst tier (SPEC §2). Read back with every field explicit except an infinite `active`.",
   "properties": {
     "limit": R("Count"), "window": R("Duration"),
     "active": {"allOf": [R("Duration")], "nullable": True, "description": "Omitted or null: infinite."},
     "cooldown": {"allOf": [R("Duration")], "nullable": True, "description": "Default 0s."},
     "skippable": {"type": "boolean", "nullable": True, "description": "Default false."}}},
 "TierList": {"type": "array", "items": R("Tier"),
   "description": "At most 64 tiers (MAX_TIERS); a rate resource holds at most 100000 tiers in all, its own and its overrides' (MAX_TIERS_PER_RESOURCE)."},
 "RateOverride": {"type": "object", "additionalProperties": False,
   "description": "A per-domain override of a rate-limited resource: replaces H and/or the whole tier list.",
   "properties": {"hard_limit": {"allOf": [R("Count")], "nullable": True},
                  "tiers": {"allOf": [R("TierList")], "nullable": True}}},
 "CopyOverride": {"type": "object", "additionalProperties": False, "required": ["domain_limit"],
   "description": "A per-domain override of a copy-limited resource.",
   "properties": {"domain_limit": R("Count")}},
 "Override": {"oneOf": [R("RateOverride"), R("CopyOverride")]},
 "GroupBody": {"type": "object", "additionalProperties": False, "required": ["limit"],
   "description": "A domain group; `name`, if sent, must be the one in the URL.",
   "properties": {"name": {"allOf": [R("Name")], "nullable": True}, "limit": R("Count"),
                  "domains": {"type": "array", "items": R("Name"), "uniqueItems": True, "nullable": True,
                              "description": "At most 10000 memberships over all the groups of a resource (MAX_GROUP_MEMBERS)."}}},
 "Group": {"type": "object", "additionalProperties": False, "required": ["name", "limit"],
   "properties": {"name": R("Name"), "limit": R("Count"),
                  "domains": {"type": "array", "items": R("Name"), "uniqueItems": True, "nullable": True,
                              "description": "At most 10000 memberships over all the groups of a resource (MAX_GROUP_MEMBERS)."}}},
 "RateResource": {"type": "object", "additionalProperties": False, "required": ["kind", "tiers"],
   "description": "A rate-limited resource (SPEC §2, §6). `name` may be omitted in a PUT body (it comes from the URL).",
   "properties": {
     "name": {"allOf": [R("Name")], "nullable": True}, "kind": {"type": "string", "enum": ["rate"]},
     "hard_limit": {"allOf": [R("Count")], "nullable": True},
     "global_limit": {"allOf": [R("Count")], "nullable": True},
     "tiers": R("TierList"),
     "domains": {"type": "object", "nullable": True, "additionalProperties": R("RateOverride"), "description": "At most 10000 overrides (MAX_DOMAIN_OVERRIDES)."}}},
 "CopyResource": {"type": "object", "additionalProperties": False, "required": ["kind", "domain_limit"],
   "description": "A copy-limited resource (SPEC §3, §6).",
   "properties": {
     "name": {"allOf": [R("Name")], "nullable": True}, "kind": {"type": "string", "enum": ["copy"]},
     "domain_limit": R("Count"),
     "global_limit": {"allOf": [R("Count")], "nullable": True},
     "domains": {"type": "object", "nullable": True, "additionalProperties": R("CopyOverride"), "description": "At most 10000 overrides (MAX_DOMAIN_OVERRIDES)."},
     "groups": {"type": "array", "nullable": True, "items": R("Group"), "description": "At most 1000 groups (MAX_GROUPS)."}}},
 "Resource": {"oneOf": [R("RateResource"), R("CopyResource")],
              "discriminator": {"propertyName": "kind", "mapping": {"rate": "#/components/schemas/RateResource", "copy": "#/components/schemas/CopyResource"}}},
 "NewResource": {"description": "A resource to create; its name is required.",
   "oneOf": [{"allOf": [R("RateResource")], "required": ["name"], "properties": {"name": R("Name")}},
             {"allOf": [R("CopyResource")], "required": ["name"], "properties": {"name": R("Name")}}]},
 "NamespaceSettings": {"type": "object", "additionalProperties": False,
   "description": "The switches of SPEC §4. Omitted or null: false.",
   "properties": {"allow_unconfigured": {"type": "boolean", "nullable": True},
                  "ignore_configured": {"type": "boolean", "nullable": True}}},
 "NamespaceState": {"type": "object", "additionalProperties": False, "required": ["allow_unconfigured", "ignore_configured"],
   "properties": {"allow_unconfigured": {"type": "boolean"}, "ignore_configured": {"type": "boolean"}}},
 "ConfigDocument": {"type": "object", "additionalProperties": False, "nullable": True,
   "description": "The whole configuration, the YAML file of SPEC §6 (as YAML or JSON). Resource names must be unique.",
   "properties": {"namespaces": {"type": "object", "nullable": True, "additionalProperties": R("NamespaceSettings"), "description": "At most 10000 namespaces (MAX_NAMESPACES)."},
                  "resources": {"type": "array", "nullable": True, "items": R("NewResource"), "description": "At most 100000 resources (MAX_RESOURCES)."}}},
 "Version": {"type": "integer", "minimum": 0, "description": "A global configuration version."},
 "Adjustment": {"type": "object", "additionalProperties": False, "required": ["path", "change"],
   "properties": {"path": {"type": "string"}, "change": {"type": "string"}}},
 "ResourceCommit": {"type": "object", "additionalProperties": False, "required": ["version", "changed", "resource", "adjustments"],
   "properties": {"version": R("Version"), "changed": {"type": "boolean"}, "resource": R("Resource"),
                  "adjustments": {"type": "array", "items": R("Adjustment")}}},
 "NamespaceCommit": {"type": "object", "additionalProperties": False, "required": ["version", "changed", "namespace", "settings"],
   "properties": {"version": R("Version"), "changed": {"type": "boolean"}, "namespace": {"type": "string"}, "settings": R("NamespaceState")}},
 "DeleteCommit": {"type": "object", "additionalProperties": False, "required": ["version", "changed"],
   "properties": {"version": R("Version"), "changed": {"type": "boolean"}}},
 "ResourceList": {"type": "object", "additionalProperties": False, "required": ["version", "resources"],
   "properties": {"version": R("Version"), "resources": {"type": "array", "items": R("Resource")}}},
 "OverrideList": {"type": "object", "additionalProperties": False, "required": ["version", "domains"],
   "properties": {"version": R("Version"), "domains": {"type": "object", "additionalProperties": R("Override")}}},
 "GroupList": {"type": "object", "additionalProperties": False, "required": ["version", "groups"],
   "properties": {"version": R("Version"), "groups": {"type": "array", "items": R("Group")}}},
 "NamespaceList": {"type": "object", "additionalProperties": False, "required": ["version", "namespaces"],
   "properties": {"version": R("Version"), "namespaces": {"type": "object", "additionalProperties": R("NamespaceState")}}},
 "ExportedConfig": {"type": "object", "additionalProperties": False, "required": ["resources"],
   "properties": {"namespaces": {"type": "object", "additionalProperties": R("NamespaceState")},
                  "resources": {"type": "array", "items": R("Resource")}}},
 "Changes": {"type": "object", "additionalProperties": False,
   "required": ["epoch", "version", "since", "snapshot", "resources", "deleted_resources", "namespaces", "deleted_namespaces"],
   "properties": {
     "epoch": {"type": "string", "description": "Random id of the database; send it back as `epoch`."},
     "version": R("Version"), "since": R("Version"),
     "snapshot": {"type": "boolean", "description": "True: the lists are the whole configuration and replace the client's view."},
     "resources": {"type": "array", "items": R("Resource"), "description": "Created or changed (whole documents)."},
     "deleted_resources": {"type": "array", "items": {"type": "string"}},
     "namespaces": {"type": "object", "additionalProperties": R("NamespaceState")},
     "deleted_namespaces": {"type": "array", "items": {"type": "string"}}}},
 "DiffEntry": {"type": "object", "additionalProperties": False, "required": ["kind", "name", "op", "before", "after"],
   "properties": {"kind": {"type": "string", "enum": ["resource", "namespace"]}, "name": {"type": "string"},
                  "op": {"type": "string", "enum": ["add", "change", "remove"]},
                  "before": {"type": "object", "nullable": True, "description": "The stored document (null on add)."},
                  "after": {"type": "object", "nullable": True, "description": "The imported document, normalized (null on remove)."}}},
 "ImportOutcome": {"type": "object", "additionalProperties": False,
   "required": ["dry_run", "changed", "base_version", "version", "diff", "adjustments"],
   "properties": {"dry_run": {"type": "boolean"}, "changed": {"type": "boolean"},
                  "base_version": R("Version"), "version": R("Version"),
                  "diff": {"type": "array", "items": R("DiffEntry")},
                  "adjustments": {"type": "array", "items": R("Adjustment")}}},
 "Problem": {"type": "object", "additionalProperties": False, "required": ["path", "message"],
   "properties": {"path": {"type": "string", "description": "Field path in the body (`tiers[0].window`), a URL parameter name (`domain`), a header name, or empty for the body as a whole."},
                  "message": {"type": "string"}}},
 "Error": {"type": "object", "additionalProperties": False, "required": ["error", "message", "problems"],
   "properties": {"error": {"type": "string", "enum": ["invalid", "unauthorized", "forbidden", "not_found", "already_exists", "wrong_kind", "version_conflict", "unsupported_media_type", "payload_too_large", "method_not_allowed", "unavailable", "internal"]},
                  "message": {"type": "string"},
                  "problems": {"type": "array", "items": R("Problem")},
                  "current_version": R("Version")}},
}
def eresp(desc):
    return {"description": desc, "content": {"application/json": {"schema": R("Error")}}}
responses = {
 "400": eresp("The request is invalid: every problem with its path. Nothing was changed."),
 "401": {**eresp("No valid bearer token (`WWW-Authenticate: Bearer`)."),
         "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}}},
 "403": eresp("The token may only read."),
 "404": eresp("No such resource, override, group, member or namespace (or a name that was not percent-encoded)."),
 "409": eresp("The resource exists already."),
 "412": eresp("`If-Match` names a version after which the target changed; `current_version` tells the version now. Nothing was changed."),
 "413": eresp("The body is larger than 16 MiB."),
 "415": eresp("The body's Content-Type is not accepted."),
 "422": eresp("The operation does not fit the resource's kind (groups of a rate-limited resource)."),
 "503": {**eresp("The configuration database is unavailable (unreachable, disk full, locked by another writer past the lock timeout). Nothing was changed; `Retry-After` says when to try again."),
         "headers": {"Retry-After": {"description": "Seconds to wait before trying again.", "schema": {"type": "integer", "minimum": 1}}}},
}
params = {
 "name": {"name": "name", "in": "path", "required": True, "schema": {"type": "string"},
          "description": "The resource name, percent-encoded as one path segment (`api/search` → `api%2Fsearch`).", "example": "sandbox/vm"},
 "domain": {"name": "domain", "in": "path", "required": True, "schema": {"type": "string"}, "description": "A domain name, percent-encoded.", "example": "tenant-7"},
 "group": {"name": "group", "in": "path", "required": True, "schema": {"type": "string"}, "description": "A group name, percent-encoded.", "example": "probation"},
 "namespace": {"name": "namespace", "in": "path", "required": True, "schema": {"type": "string"}, "description": "A namespace name.", "example": "billing"},
 "IfMatch": {"name": "If-Match", "in": "header", "required": False, "schema": {"type": "string", "pattern": "^[ \\t]*(\\*|\"[0-9]{1,19}\"|[0-9]{1,19})([ \\t]*,[ \\t]*(\\*|\"[0-9]{1,19}\"|[0-9]{1,19}))*[ \\t]*$"},
   "description": "The version the change is based on (`\"7\"` or `7`; several comma-separated; `*`: the target must exist). 412 if the target changed after it."},
}
headers = {"ETag": {"description": "The configuration version read or written, quoted (`\"7\"`).", "schema": {"type": "string"}}}
P = lambda n: {"$ref": f"#/components/parameters/{n}"}
READ = [{}, {"bearerAuth": []}]
WRITE = [{"bearerAuth": []}]
def read_op(op_id, summary, schema, params_=(), extra=()):
    r = {"200": resp("OK", schema), "400": err("400"), "401": err("401"), "503": err("503")}
    for e in extra: r[e] = err(e)
    return {"operationId": op_id, "summary": summary, "tags": [], "security": READ,
            "parameters": list(params_), "responses": r}
def write_op(op_id, summary, ok, body=None, params_=(), created=True, extra=("404",), has_body=True):
    r = {"200": resp(ok[0], R(ok[1]))}
    if created: r["201"] = resp("Created.", R(ok[1]))
    codes = ["400", "401", "403", *extra, "412", "503"]
    if has_body: codes += ["413", "415"]
    for c in sorted(set(codes)): r[c] = err(c)
    op = {"operationId": op_id, "summary": summary, "security": WRITE,
          "parameters": list(params_) + [P("IfMatch")], "responses": dict(sorted(r.items()))}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op
def tag(ops, t):
    for op in ops.values():
        if isinstance(op, dict):
            op["tags"] = [t]
    return ops

paths = {
 "/openapi.json": {"get": {"operationId": "openapi", "summary": "This document.", "tags": ["meta"], "security": [{}],
     "responses": {"200": {"description": "The OpenAPI document.", "content": {"application/json": {"schema": {"type": "object"}}}}}}},
 "/v1/resources": tag({
   "get": read_op("listResources", "All resources, normalized, sorted by name.", R("ResourceList"),
       [{"name": "namespace", "in": "query", "required": False, "schema": {"type": "string"}, "description": "Only resources of this namespace."}]),
   "post": write_op("createResource", "Create a resource named by its body; 409 if it exists.", ("Unchanged.", "ResourceCommit"), R("NewResource"),
       extra=("409",)),
 }, "resources"),
 "/v1/resources/{name}": tag({
   "parameters": [P("name")],
   "get": read_op("getResource", "One resource, normalized.", R("Resource"), extra=("404",)),
   "put": write_op("putResource", "Create or replace a resource (validated and normalized first).", ("Replaced, or unchanged.", "ResourceCommit"), R("Resource"), extra=()),
   "delete": write_op("deleteResource", "Delete a resource.", ("Deleted.", "DeleteCommit"), created=False, has_body=False),
 }, "resources"),
 "/v1/resources/{name}/domains": tag({
   "parameters": [P("name")],
   "get": read_op("listOverrides", "The per-domain overrides of a resource.", R("OverrideList"), extra=("404",)),
 }, "overrides"),
 "/v1/resources/{name}/domains/{domain}": tag({
   "parameters": [P("name"), P("domain")],
   "get": read_op("getOverride", "The override of one domain.", R("Override"), extra=("404",)),
   "put": write_op("putOverride", "Create or replace the override of one domain (rate: hard_limit and/or tiers; copy: domain_limit).",
       ("Replaced, or unchanged.", "ResourceCommit"), R("Override")),
   "delete": write_op("deleteOverride", "Remove the override of one domain.", ("Removed.", "ResourceCommit"), created=False, has_body=False),
 }, "overrides"),
 "/v1/resources/{name}/groups": tag({
   "parameters": [P("name")],
   "get": read_op("listGroups", "The domain groups of a copy-limited resource.", R("GroupList"), extra=("404", "422")),
 }, "groups"),
 "/v1/resources/{name}/groups/{group}": tag({
   "parameters": [P("name"), P("group")],
   "get": read_op("getGroup", "One group.", R("Group"), extra=("404", "422")),
   "put": write_op("putGroup", "Create (appended) or replace (in place) a group.", ("Replaced, or unchanged.", "ResourceCommit"), R("GroupBody"), extra=("404", "422")),
   "delete": write_op("deleteGroup", "Remove a group.", ("Removed.", "ResourceCommit"), created=False, extra=("404", "422"), has_body=False),
 }, "groups"),
 "/v1/resources/{name}/groups/{group}/domains/{domain}": tag({
   "parameters": [P("name"), P("group"), P("domain")],
   "put": write_op("addMember", "Add a domain to a group (no body; unchanged if it is a member).", ("Unchanged: already a member.", "ResourceCommit"), extra=("404", "422"), has_body=False),
   "delete": write_op("removeMember", "Remove a domain from a group.", ("Removed.", "ResourceCommit"), created=False, extra=("404", "422"), has_body=False),
 }, "groups"),
 "/v1/namespaces": tag({
   "get": read_op("listNamespaces", "Every namespace with settings.", R("NamespaceList")),
 }, "namespaces"),
 "/v1/namespaces/{namespace}": tag({
   "parameters": [P("namespace")],
   "get": read_op("getNamespace", "The settings of one namespace.", R("NamespaceState"), extra=("404",)),
   "put": write_op("putNamespace", "Create or replace the settings of a namespace.", ("Replaced, or unchanged.", "NamespaceCommit"), R("NamespaceSettings"), extra=()),
   "delete": write_op("deleteNamespace", "Remove the settings of a namespace.", ("Removed.", "DeleteCommit"), created=False, has_body=False),
 }, "namespaces"),
 "/v1/config": tag({
   "get": read_op("exportConfig", "The whole configuration (SPEC §6), as JSON or, with `format=yaml` or `Accept: application/yaml`, YAML.",
       None, [{"name": "format", "in": "query", "required": False, "schema": {"type": "string", "enum": ["json", "yaml"]}}]),
   "put": None,
 }, "config"),
 "/v1/changes": tag({
   "get": read_op("changes", "What changed after version `since`, or a full snapshot.", R("Changes"),
       [{"name": "since", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0},
         "description": "The version of the client's view; 0 or absent: a snapshot."},
        {"name": "epoch", "in": "query", "required": False, "schema": {"type": "string"},
         "description": "The epoch of the client's view; another epoch gets a snapshot."}]),
 }, "sync"),
}
paths["/v1/config"]["get"]["responses"]["200"] = {"description": "The configuration.", "headers": {"ETag": {"$ref": "#/components/headers/ETag"}},
  "content": {"application/json": {"schema": R("ExportedConfig")}, "application/yaml": {"schema": R("ExportedConfig")}}}
imp = write_op("importConfig", "Replace the whole configuration as one commit; `dry_run=true` only computes the difference (and needs only read access).",
   ("The difference, applied unless a dry run.", "ImportOutcome"), None, extra=(), created=False)
imp["parameters"].insert(0, {"name": "dry_run", "in": "query", "required": False, "schema": {"type": "boolean"}})
imp["security"] = [{"bearerAuth": []}, {}]
imp["description"] = "A write needs a write token; a dry run is a read. The difference is computed on the server, by resource and namespace name. With `If-Match` set to the `base_version` of a dry run, exactly the difference shown is applied, or 412."
imp["requestBody"] = {"required": True, "content": {"application/yaml": {"schema": R("ConfigDocument")}, "application/json": {"schema": R("ConfigDocument")}}}
imp["tags"] = ["config"]
paths["/v1/config"]["put"] = imp
del paths["/v1/resources"]["post"]["responses"]["200"]
doc = {
 "openapi": "3.0.3",
 "info": {"title": "Charon configuration service", "version": "1",
   "description": "Resources (rate- and copy-limited), per-domain overrides, groups and membership, namespace settings, whole-configuration import/export and the change feed of limiting servers. Every change is validated and normalized (SPEC §2) before it is committed; every commit bumps one global version, returned in `ETag`. Writes accept `If-Match`. Mutating requests need a bearer token with write access; reads are open unless the service requires a token for them. See docs/config-service.md."},
 "paths": paths,
 "components": {"schemas": schemas, "responses": responses, "parameters": params, "headers": headers,
   "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}},
}
print(json.dumps(doc, indent=2, ensure_ascii=False))
