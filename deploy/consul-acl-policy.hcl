# The least a kafka-lease gateway needs in Consul, for the default --consul-prefix.
# Create it with: consul acl policy create -name kafka-lease -rules @deploy/consul-acl-policy.hcl
# and give the gateways a token with it (--consul-token-file, or --consul-token).

# The lock keys: <prefix>/<group>/<topic>/<partition>.
key_prefix "kafka-lease/" {
  policy = "write"
}

# One session per gateway instance, created on the node of the local agent.
session_prefix "" {
  policy = "write"
}

# The gateway registers itself with its local agent, with the TCP check its session is
# bound to (fast failover when the gateway process dies).
service_prefix "kafka-lease" {
  policy = "write"
}

# Nothing else: tests/consul_security.rs shows that leaving out any rule above stops a
# gateway, and that these are enough (on a Consul with default-deny ACLs).
