package lease

// CompareEventIDs compares two ids written by EventID.String. It fails with an *InvalidError
// when either is not an id.
func CompareEventIDs(a, b string) (int, error) {
	x, err := ParseEventID(a)
	if err != nil {
		return 0, err
	}
	y, err := ParseEventID(b)
	if err != nil {
		return 0, err
	}
	return x.Compare(y), nil
}
