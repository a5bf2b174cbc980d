package testutil

import (
	"os"
	"regexp"
)

// READMEPrograms returns the complete Go programs (```go blocks starting
// with "package main") of the README at path.
func READMEPrograms(path string) ([][]byte, error) {
	readme, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var programs [][]byte
	for _, m := range readmeProgram.FindAllSubmatch(readme, -1) {
		programs = append(programs, m[1])
	}
	return programs, nil
}

var readmeProgram = regexp.MustCompile("(?s)```go\n(package main\n.*?)```")
