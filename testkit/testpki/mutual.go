package testpki

import (
	"crypto/tls"
	"fmt"
	"path/filepath"
)

// MutualTLS is the certificates of a mutual-TLS link, such as the one between l7d
// and keyserverd: a CA for the server and one for the clients, the server's
// certificate and, optionally, one client's, written as PEM files in one directory.
type MutualTLS struct {
	ServerCA, ClientCA     *CA
	ServerLeaf, ClientLeaf tls.Certificate // ClientLeaf is empty without a client
	ServerCAFile           string          // the server CA's certificate, which clients trust: DIR/server-ca.pem
	ClientCAFile           string          // the client CA's certificate, which the server trusts: DIR/client-ca.pem
	ServerCert, ServerKey  string          // DIR/<serverCN>.pem and DIR/<serverCN>.key
	ClientCert, ClientKey  string          // DIR/<clientCN>.pem and .key; "" without a client
}

// NewMutualTLS creates the two CAs (named "<name> server CA" and "<name> client
// CA"), a server certificate named serverCN valid for hosts (DNS names or IPs) and,
// unless clientCN is "", a client certificate named clientCN, and writes them all
// to dir, which must exist. More client certificates come from ClientCA.Leaf.
func NewMutualTLS(dir, name, serverCN string, hosts []string, clientCN string) (*MutualTLS, error) {
	m := &MutualTLS{}
	var err error
	if m.ServerCA, err = NewCA(name + " server CA"); err != nil {
		return nil, err
	}
	if m.ClientCA, err = NewCA(name + " client CA"); err != nil {
		return nil, err
	}
	if m.ServerLeaf, err = m.ServerCA.Leaf(serverCN, hosts...); err != nil {
		return nil, fmt.Errorf("issuing %s's certificate: %w", serverCN, err)
	}
	if m.ServerCAFile, err = m.ServerCA.WriteFiles(dir, "server", m.ServerLeaf); err != nil {
		return nil, fmt.Errorf("writing the server certificates: %w", err)
	}
	m.ServerCert, m.ServerKey = filepath.Join(dir, serverCN+".pem"), filepath.Join(dir, serverCN+".key")
	var clients []tls.Certificate
	if clientCN != "" {
		if m.ClientLeaf, err = m.ClientCA.Leaf(clientCN); err != nil {
			return nil, fmt.Errorf("issuing %s's certificate: %w", clientCN, err)
		}
		clients = append(clients, m.ClientLeaf)
		m.ClientCert, m.ClientKey = filepath.Join(dir, clientCN+".pem"), filepath.Join(dir, clientCN+".key")
	}
	if m.ClientCAFile, err = m.ClientCA.WriteFiles(dir, "client", clients...); err != nil {
		return nil, fmt.Errorf("writing the client certificates: %w", err)
	}
	return m, nil
}
