package agent

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/store"
)

// headKey is the store's head key, which a snapshot reads (control/store).
const headKey = "/tiergate/meta/v1/head"

// BlacklistPrefix is the prefix of the blacklists a node follows (control/blsync's
// Prefix, which a test holds equal).
const BlacklistPrefix = "/tiergate/blacklists/v1/"

// RoleName returns the name of node's etcd role: tiergate-node-<node>.
func RoleName(node string) string { return "tiergate-node-" + node }

// GrantNode creates node's etcd role (RoleName) with what its agent needs and
// nothing more: read on the object prefix (store.Prefix), on the store's head key
// and on the blacklists (BlacklistPrefix), read and write on its own status key
// (StatusKey) and seen record (SeenKey). Run with an etcd user
// allowed to change roles (root); the node's user is then granted the role
// (UserGrantRole). A role that exists is given the permissions again.
func GrantNode(ctx context.Context, cli *clientv3.Client, node string) error {
	if err := store.CheckName(node); err != nil {
		return fmt.Errorf("agent: node: %w", err)
	}
	role := RoleName(node)
	if _, err := cli.RoleGet(ctx, role); err != nil {
		if _, err := cli.RoleAdd(ctx, role); err != nil {
			return fmt.Errorf("agent: adding the etcd role %s: %w", role, err)
		}
	}
	grants := []struct {
		key, end string
		perm     clientv3.PermissionType
	}{
		{store.Prefix, clientv3.GetPrefixRangeEnd(store.Prefix), clientv3.PermissionType(clientv3.PermRead)},
		{headKey, "", clientv3.PermissionType(clientv3.PermRead)},
		{BlacklistPrefix, clientv3.GetPrefixRangeEnd(BlacklistPrefix), clientv3.PermissionType(clientv3.PermRead)},
		{StatusKey(node), "", clientv3.PermissionType(clientv3.PermReadWrite)},
		{SeenKey(node), "", clientv3.PermissionType(clientv3.PermReadWrite)},
	}
	for _, g := range grants {
		if _, err := cli.RoleGrantPermission(ctx, role, g.key, g.end, g.perm); err != nil {
			return fmt.Errorf("agent: granting %s on %s: %w", role, g.key, err)
		}
	}
	return nil
}
