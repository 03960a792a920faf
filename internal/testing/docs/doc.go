// Package docs holds the checks that keep the repository's documentation
// true: every Go snippet of README.md and docs/ is compiled code, every
// relative link and anchor resolves, and docs/ stays within its word
// budget. Its tests also hold the code of the snippets that no test or
// example elsewhere holds. docs/development.md states the convention.
package docs
