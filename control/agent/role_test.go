package agent

import (
	"testing"

	"go.etcd.io/etcd/api/v3/authpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/store"
)

func TestGrantNode(t *testing.T) {
	s := openStore(t, t.TempDir())
	cli := s.Client()
	for range 2 { // a second time changes nothing
		if err := GrantNode(ctx, cli, "l7-a"); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cli.RoleGet(ctx, RoleName("l7-a"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]authpb.Permission_Type{}
	for _, p := range resp.Perm {
		got[string(p.Key)+".."+string(p.RangeEnd)] = p.PermType
	}
	want := map[string]authpb.Permission_Type{
		store.Prefix + ".." + clientv3.GetPrefixRangeEnd(store.Prefix): authpb.READ,
		headKey + "..": authpb.READ,
		BlacklistPrefix + ".." + clientv3.GetPrefixRangeEnd(BlacklistPrefix): authpb.READ,
		StatusKey("l7-a") + "..": authpb.READWRITE,
		SeenKey("l7-a") + "..":   authpb.READWRITE,
	}
	if len(got) != len(want) {
		t.Fatalf("permissions %v, want %v", got, want)
	}
	for k, p := range want {
		if got[k] != p {
			t.Fatalf("permissions %v, want %v", got, want)
		}
	}
	if err := GrantNode(ctx, cli, "a/b"); err == nil {
		t.Fatal("a node name with a '/' was taken")
	}
}
