module github.com/tiergate/tiergate

go 1.26.8

require (
	github.com/miekg/pkcs11 v1.1.2 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
)
