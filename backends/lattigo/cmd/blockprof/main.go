// Command blockprof profiles the fused blocks of a sub-plan (scripts/block_subplan.py cuts
// one node's blocks out of a plan) with slotlattigo.ProfileBlock outside Python:
//
//	blockprof SUBPLAN.json '{"levels": [9, 6, 3], "repeat": 2}'
//
// It prints ProfileBlock's result JSON (per run: seconds, page faults, the phases).
package main

import (
	"fmt"
	"os"

	slot "slotplan/lattigo"
)

func main() {
	if len(os.Args) < 2 || len(os.Args) > 3 {
		fmt.Fprintln(os.Stderr, "usage: blockprof SUBPLAN.json [OPTIONS_JSON]")
		os.Exit(2)
	}
	plan, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	opt := ""
	if len(os.Args) == 3 {
		opt = os.Args[2]
	}
	res, err := slot.ProfileBlock(string(plan), opt)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(res)
}
