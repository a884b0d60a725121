// Package hostile holds the hostile-input suite (hostile_test.go): a
// real gateway over SQLite and over PostgreSQL is sent hundreds of
// malformed requests over every route of both doors, without and with a
// credential, and must answer each without a 5xx and within 2 s, stay
// ready, give its heap back, and write nothing. It has no code of its own.
package hostile
