package l7d

// certInUse stands for agent.CertInUse until control/agent has it.
type certInUse struct {
	Name    string `json:"name"`
	Version int    `json:"version"`
	SHA256  string `json:"sha256"`
}
