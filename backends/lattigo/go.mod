module slotplan/lattigo

go 1.24.0

require (
	github.com/go-python/gopy v0.4.10
	github.com/tuneinsight/lattigo/v6 v6.1.1
	golang.org/x/sys v0.16.0
)

require (
	github.com/ALTree/bigfloat v0.0.0-20220102081255-38c8b72a9924 // indirect
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/google/go-cmp v0.5.8 // indirect
	github.com/kr/text v0.2.0 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/stretchr/testify v1.8.0 // indirect
	golang.org/x/crypto v0.18.0 // indirect
	golang.org/x/exp v0.0.0-20230321023759-10a507213a29 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)
